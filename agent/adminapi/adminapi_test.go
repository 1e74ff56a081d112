package adminapi

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/localapi/localapitest"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

type fakeAgent struct{ st *adminv1.AgentStatus }

func (f fakeAgent) Status() *adminv1.AgentStatus { return proto.Clone(f.st).(*adminv1.AgentStatus) }

func TestAgentStatusRoundTrip(t *testing.T) {
	want := &adminv1.AgentStatus{
		Stage: adminv1.Stage_STAGE_ATTESTING, StageSinceUnix: 1_790_000_000, Attempt: 3,
		VerifierEndpoint: "verifier-1:7443", LastError: "connection refused",
		LastReason: latchkeyv1.Reason_UNAVAILABLE, NodeName: "worker-1",
		DiskUuid: "0b5e6f6e-4b8c-4f51-9d7e-5f1c2b3a4d5e", Variant: latchkeyv1.Variant_VARIANT_TPM,
		StatusLine: "attesting to verifier-1:7443 (attempt 3)",
	}
	conn := localapitest.Start(t, localapi.Config{Services: []localapi.Service{Service(fakeAgent{want})}})
	got, err := adminv1.NewAgentAdminClient(conn).Status(context.Background(), &adminv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// The agent serves no verifier methods.
	_, err = adminv1.NewVerifierAdminClient(conn).ListTokens(context.Background(), &adminv1.ListTokensRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListTokens on the agent: got %v, want Unimplemented", err)
	}
}

func TestStatusBeforeAnyState(t *testing.T) {
	conn := localapitest.Start(t, localapi.Config{Services: []localapi.Service{Service(fakeAgent{nil})}})
	_, err := adminv1.NewAgentAdminClient(conn).Status(context.Background(), &adminv1.StatusRequest{})
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "agent state not available yet" {
		t.Fatalf("Status with no state: %v", err)
	}
}

func TestWriteStatus(t *testing.T) {
	now := time.Unix(1_790_000_100, 0)
	var buf bytes.Buffer
	err := WriteStatus(&buf, &adminv1.AgentStatus{
		Stage: adminv1.Stage_STAGE_FAILED, StageSinceUnix: 1_790_000_040, Attempt: 1,
		VerifierEndpoint: "v1:7443", LastError: "pcr 7 holds an unlisted value",
		LastReason: latchkeyv1.Reason_PCR_MISMATCH, ExitCode: 3, Rejoin: true, DiskUuid: "u-1",
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stage:       failed (for 1m0s)",
		"state disk:  u-1 (rejoin)",
		"last error:  pcr 7 holds an unlisted value [PCR_MISMATCH]",
		"exit code:   3 (refused-by-policy)",
	} {
		if !strings.Contains(buf.String(), want+"\n") {
			t.Errorf("status output lacks %q:\n%s", want, buf.String())
		}
	}
}
