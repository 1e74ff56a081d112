package app_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	var body []byte
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				return string(body)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsMoveWithJoinsAndRefusals scrapes the assembled verifier's
// /metrics after a real join and a real refusal on swtpm.
func TestMetricsMoveWithJoinsAndRefusals(t *testing.T) {
	addr := freeAddr(t)
	r := newRig(t, rigOpts{metricsListen: addr})
	if _, err := r.agent(t, r.issuer(t), 30*time.Second).Get(context.Background(), worker()); err != nil {
		t.Fatal(err)
	}
	r.sim.Extend(t, 14, []byte("tampered"))
	r.refusedWithTokens(t, r.issuer(t), worker(), latchkeyv1.Reason_PCR_MISMATCH, 1)
	m := scrape(t, addr)
	for _, want := range []string{
		`latchkey_verifier_joins_total{reason="none",result="accepted",variant="tpm"} 1`,
		`latchkey_verifier_joins_total{reason="PCR_MISMATCH",result="refused",variant="tpm"} 1`,
		`latchkey_verifier_tokens_minted_total 1`,
		`latchkey_verifier_validation_duration_seconds_count{variant="tpm"} 2`,
		`latchkey_verifier_policy_info{digest="sha256:`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", m)
	}
}
