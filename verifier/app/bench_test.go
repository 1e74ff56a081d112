package app_test

import (
	"context"
	"syscall"
	"testing"
	"time"
)

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFullJoinTPM is one whole join per op against swtpm: TCP and
// TLS 1.3 handshake, EK/AK creation and quote on swtpm, credential
// activation round trip, validation, key derivation, token mint on the
// fake clientset (bootstrap signer simulated), ticket and ack. ns/op is
// the wall time of one join; cpu-ms/op is this process's CPU (agent and
// verifier together, swtpm excluded) per join, an upper bound on the
// verifier's share.
func BenchmarkFullJoinTPM(b *testing.B) {
	r := newRig(b, rigOpts{})
	c := r.agent(b, r.issuer(b), time.Minute)
	req := worker()
	req.Rejoin = true // no token: measure the attestation path alone
	ctx := context.Background()
	b.ResetTimer()
	start := cpuTime(b)
	for i := 0; i < b.N; i++ {
		if _, err := c.Get(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N)/1e6, "cpu-ms/op")
}
