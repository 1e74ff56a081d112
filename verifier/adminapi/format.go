package adminapi

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/latchkey/latchkey/internal/localapi"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/protocol"
)

// WriteTokens prints bootstrap tokens as a table (`latchkey-verifier
// tokens list`), marking tokens whose expiration cannot be parsed: nothing
// ever expires them. An expiry of 0 is unknown.
func WriteTokens(w io.Writer, tokens []*adminv1.Token, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNODE\tROLE\tAGE\tEXPIRES")
	for _, t := range tokens {
		age := "-"
		if t.GetCreatedUnix() > 0 {
			age = localapi.Ago(now, t.GetCreatedUnix())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.GetId(), localapi.OrDash(t.GetNodeName()),
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
		id := localapi.OrDash(b.GetIdentity())
		if b.GetReleasedUnix() > 0 {
			id = "released " + localapi.Ago(now, b.GetReleasedUnix()) + " ago by " + localapi.OrDash(b.GetReleasedBy())
		}
		age := "-"
		if b.GetCreatedUnix() > 0 {
			age = localapi.Ago(now, b.GetCreatedUnix())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", kindName(b.GetKind()), b.GetName(), id, localapi.OrDash(b.GetTokenId()), age)
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
		// The record names no expiry (written before latchkey kept
		// them); the token expires at its Secret's, which the verifier
		// cannot read.
		return "unknown"
	case t.GetExpiryUnix() <= now.Unix():
		return "expired " + localapi.Ago(now, t.GetExpiryUnix()) + " ago"
	default:
		return "in " + time.Unix(t.GetExpiryUnix(), 0).Sub(now).Round(time.Second).String()
	}
}

func roleName(r latchkeyv1.Role) string {
	if n := protocol.RoleName(r); n != "" {
		return n
	}
	return "-"
}

// WriteSkipped prints the records a listing left out because they could
// not be read, one line each, so an operator sees them next to the table
// (on stderr) instead of a listing that silently lacks them.
func WriteSkipped(w io.Writer, skipped []*adminv1.SkippedRecord) {
	if len(skipped) == 0 {
		return
	}
	fmt.Fprintf(w, "warning: %d unreadable record(s) left out of the listing:\n", len(skipped))
	for _, s := range skipped {
		fmt.Fprintf(w, "  %s: %s\n", s.GetKey(), s.GetReason())
	}
}
