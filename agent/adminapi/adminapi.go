// Package adminapi is the agent's admin service (latchkey.admin.v1
// AgentAdmin), served on the agent's status socket by internal/localapi,
// and the status table `latchkey-agent status` prints.
package adminapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/internal/localapi"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// State is the agent's live boot state. Status must be cheap, safe for
// concurrent use, and return a message the caller may not modify
// afterwards (a fresh copy).
type State interface {
	Status() *adminv1.AgentStatus
}

// Service is the AgentAdmin service answering from state.
func Service(state State) localapi.Service {
	return func(s *grpc.Server, _ *slog.Logger) {
		adminv1.RegisterAgentAdminServer(s, agentServer{state: state})
	}
}

type agentServer struct {
	adminv1.UnimplementedAgentAdminServer
	state State
}

func (a agentServer) Status(context.Context, *adminv1.StatusRequest) (*adminv1.AgentStatus, error) {
	st := a.state.Status()
	if st == nil {
		return nil, status.Error(codes.Unavailable, "agent state not available yet")
	}
	return st, nil
}

// WriteStatus prints an agent status for humans (`latchkey-agent status`).
func WriteStatus(w io.Writer, st *adminv1.AgentStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	stage := stageName(st.GetStage())
	if st.GetStageSinceUnix() > 0 {
		stage += " (for " + localapi.Ago(now, st.GetStageSinceUnix()) + ")"
	}
	line("stage", stage)
	line("attempt", fmt.Sprint(st.GetAttempt()))
	line("verifier", localapi.OrDash(st.GetVerifierEndpoint()))
	line("node", localapi.OrDash(st.GetNodeName()))
	disk := localapi.OrDash(st.GetDiskUuid())
	if st.GetRejoin() {
		disk += " (rejoin)"
	}
	line("state disk", disk)
	if v := st.GetVariant(); v != latchkeyv1.Variant_VARIANT_UNSPECIFIED {
		line("variant", strings.TrimPrefix(v.String(), "VARIANT_"))
	}
	lastErr := localapi.OrDash(st.GetLastError())
	if r := st.GetLastReason(); r != latchkeyv1.Reason_REASON_UNSPECIFIED {
		lastErr += " [" + r.String() + "]"
	}
	if d := st.GetEvidenceDigest(); d != "" {
		line("evidence digest", d)
	}
	if id := st.GetTokenId(); id != "" {
		line("token id", id)
	}
	line("last error", lastErr)
	if st.GetStage() == adminv1.Stage_STAGE_FAILED {
		line("exit code", fmt.Sprintf("%d (%s)", st.GetExitCode(), exitcode.Name(int(st.GetExitCode()))))
	}
	if s := st.GetStatusLine(); s != "" {
		line("status", s)
	}
	return tw.Flush()
}

func stageName(s adminv1.Stage) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "STAGE_")), "_", " ")
}
