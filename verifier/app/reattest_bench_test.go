package app_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/logtest"
	"github.com/latchkey/latchkey/verifier/binding"
)

// reattestRig is the assembled verifier in Kubernetes mode (fake
// clientset, Lease binding store) with one node joined.
func reattestRig(b *testing.B) (*rig, *tpmissuer.Issuer) {
	sim := tpmtest.Start(b)
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		b.Fatal(err)
	}
	_, cfg := verifierFiles(b, map[string]any{"tpm": tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}},
		randomSecret(), "bench")
	r := &rig{sim: sim, client: signingClientset(b), logs: &logtest.Buffer{}}
	r.bindings, err = binding.NewLeases(binding.LeaseConfig{Client: r.client, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	startAssembled(b, r, cfg, fakeSignedMinter(b, r))
	iss := r.issuer(b)
	if _, err := r.agent(b, iss, time.Minute).Get(context.Background(), worker()); err != nil {
		b.Fatalf("join: %v\n%s", err, r.logs)
	}
	return r, iss
}

// BenchmarkReattestTPM is one re-attestation per op against swtpm (TLS
// handshake, quote, activation, verification, policy, the binding reads
// and the Lease update on the fake clientset, empty ticket, ack), next to
// BenchmarkRejoinTPMSameRig, the rejoin (disk key, no token) on the same
// rig, for a ratio measured in one run. cpu-ms/op is this process (agent
// and verifier; swtpm excluded). api-writes/op and api-reads/op count the
// clientset's actions per re-attestation.
func BenchmarkReattestTPM(b *testing.B) {
	r, iss := reattestRig(b)
	c := r.agent(b, iss, time.Minute)
	req := worker()
	req.Rejoin, req.Reattest = true, true
	before := len(r.client.Actions())
	benchGets(b, c, req, r.logs)
	b.StopTimer()
	var reads, writes int
	for _, a := range r.client.Actions()[before:] {
		switch a.GetVerb() {
		case "get", "list", "watch":
			reads++
		default:
			writes++
		}
	}
	b.ReportMetric(float64(writes)/float64(b.N), "api-writes/op")
	b.ReportMetric(float64(reads)/float64(b.N), "api-reads/op")
}

func BenchmarkRejoinTPMSameRig(b *testing.B) {
	r, iss := reattestRig(b)
	c := r.agent(b, iss, time.Minute)
	req := worker()
	req.Rejoin = true
	benchGets(b, c, req, r.logs)
}
