package app_test

import (
	"context"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/internal/logtest"
)

// The node's success line and the verifier's audit line name the same
// evidence digest and token ID, so an operator can match the two; the
// node's line never carries the key or the token secret.
func TestAgentSuccessLineMatchesVerifierAuditLine(t *testing.T) {
	r := newRig(t, rigOpts{})
	agentLog := &logtest.Buffer{}
	c := r.agentWith(t, ticket.Config{Issuer: r.issuer(t), Timeout: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(agentLog, nil))})
	tk, err := c.Get(context.Background(), worker())
	if err != nil {
		t.Fatal(err)
	}
	field := func(log, line, key string) string {
		m := regexp.MustCompile(`msg="` + line + `".*\b` + key + `=(\S+)`).FindStringSubmatch(log)
		if m == nil {
			t.Fatalf("no %s= in the %q line:\n%s", key, line, log)
		}
		return m[1]
	}
	al, vl := agentLog.String(), r.logs.String()
	for _, key := range []string{logkey.EvidenceDigest, logkey.TokenID} {
		if a, v := field(al, "ticket received", key), field(vl, "join decision", key); a != v {
			t.Errorf("%s: agent says %s, verifier says %s", key, a, v)
		}
	}
	if got := field(al, "ticket received", logkey.Endpoint); got != r.addr {
		t.Errorf("%s=%s, want %s", logkey.Endpoint, got, r.addr)
	}
	if regexp.MustCompile(regexp.QuoteMeta(tk.Token[7:])).MatchString(al) {
		t.Fatal("the agent's log carries the token secret")
	}
}
