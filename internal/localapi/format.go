package localapi

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/latchkey/latchkey/agent/exitcode"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// WriteStatus prints an agent status for humans (`latchkey-agent status`).
func WriteStatus(w io.Writer, st *adminv1.AgentStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	stage := stageName(st.GetStage())
	if st.GetStageSinceUnix() > 0 {
		stage += " (for " + ago(now, st.GetStageSinceUnix()) + ")"
	}
	line("stage", stage)
	line("attempt", fmt.Sprint(st.GetAttempt()))
	line("verifier", orDash(st.GetVerifierEndpoint()))
	line("node", orDash(st.GetNodeName()))
	disk := orDash(st.GetDiskUuid())
	if st.GetRejoin() {
		disk += " (rejoin)"
	}
	line("state disk", disk)
	if v := st.GetVariant(); v != latchkeyv1.Variant_VARIANT_UNSPECIFIED {
		line("variant", strings.TrimPrefix(v.String(), "VARIANT_"))
	}
	lastErr := orDash(st.GetLastError())
	if r := st.GetLastReason(); r != latchkeyv1.Reason_REASON_UNSPECIFIED {
		lastErr += " [" + r.String() + "]"
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

// WriteTokens prints bootstrap tokens as a table (`latchkey-verifier
// tokens list`), marking tokens whose expiration cannot be parsed: nothing
// ever expires them.
func WriteTokens(w io.Writer, tokens []*adminv1.Token, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNODE\tROLE\tAGE\tEXPIRES")
	for _, t := range tokens {
		age := "-"
		if t.GetCreatedUnix() > 0 {
			age = ago(now, t.GetCreatedUnix())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.GetId(), orDash(t.GetNodeName()),
			roleName(t.GetRole()), age, expiry(t, now))
	}
	return tw.Flush()
}

// WriteBindings prints binding records as a table (`latchkey-verifier
// bindings list`).
func WriteBindings(w io.Writer, bs []*adminv1.Binding, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tIDENTITY\tTOKEN\tAGE")
	for _, b := range bs {
		id := orDash(b.GetIdentity())
		if b.GetReleasedUnix() > 0 {
			id = "released " + ago(now, b.GetReleasedUnix()) + " ago by " + orDash(b.GetReleasedBy())
		}
		age := "-"
		if b.GetCreatedUnix() > 0 {
			age = ago(now, b.GetCreatedUnix())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", kindName(b.GetKind()), b.GetName(), id, orDash(b.GetTokenId()), age)
	}
	return tw.Flush()
}

// kindName is "node", "disk" or "-".
func kindName(k adminv1.BindingKind) string {
	switch k {
	case adminv1.BindingKind_BINDING_KIND_NODE:
		return "node"
	case adminv1.BindingKind_BINDING_KIND_DISK:
		return "disk"
	}
	return "-"
}

func expiry(t *adminv1.Token, now time.Time) string {
	switch {
	case t.GetExpirationMalformed():
		return fmt.Sprintf("MALFORMED %q (never expires; revoke it)", t.GetRawExpiration())
	case t.GetExpiryUnix() == 0:
		return "never (revoke it)"
	case t.GetExpiryUnix() <= now.Unix():
		return "expired " + ago(now, t.GetExpiryUnix()) + " ago"
	default:
		return "in " + time.Unix(t.GetExpiryUnix(), 0).Sub(now).Round(time.Second).String()
	}
}

func ago(now time.Time, unix int64) string {
	d := now.Sub(time.Unix(unix, 0)).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String()
}

func stageName(s adminv1.Stage) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "STAGE_")), "_", " ")
}

func roleName(r latchkeyv1.Role) string {
	switch r {
	case latchkeyv1.Role_ROLE_WORKER:
		return "worker"
	case latchkeyv1.Role_ROLE_CONTROL_PLANE:
		return "control-plane"
	default:
		return "-"
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
