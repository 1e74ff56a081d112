package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/internal/benchtest"
)

// BenchmarkFullJoinTPM is one whole join per op against swtpm: TCP and
// TLS 1.3 handshake, EK/AK creation and quote on swtpm, credential
// activation round trip, validation, key derivation, token mint on the
// fake clientset, ticket and ack. ns/op is the wall time of one join;
// cpu-ms/op is this process's CPU (agent and verifier together, swtpm
// excluded) per join, an upper bound on the verifier's share. The timed
// joins are rejoins (no token: the attestation path alone), so one first
// join, untimed, claims the node and disk they rejoin: identity binding
// refuses a rejoin of a disk with no record.
func BenchmarkFullJoinTPM(b *testing.B) {
	r := newRig(b, rigOpts{})
	c := r.agent(b, r.issuer(b), time.Minute)
	if _, err := c.Get(context.Background(), worker()); err != nil {
		b.Fatalf("first join: %v\n%s", err, r.logs)
	}
	req := worker()
	req.Rejoin = true
	benchGets(b, c, req, r.logs)
}

// benchGets times b.N tickets for req and reports this process's CPU per
// ticket (agent and verifier both run here).
func benchGets(b *testing.B, c *ticket.Client, req ticket.Request, logs fmt.Stringer) {
	ctx := context.Background()
	b.ResetTimer()
	start := benchtest.SelfCPU(b)
	for i := 0; i < b.N; i++ {
		if _, err := c.Get(ctx, req); err != nil {
			b.Fatalf("ticket: %v\n%s", err, logs)
		}
	}
	b.ReportMetric(float64(benchtest.SelfCPU(b)-start)/float64(b.N)/1e6, "cpu-ms/op")
}
