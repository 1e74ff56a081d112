//go:build k8s

package app_test

// Whole joins against the real control plane that scripts/test-k8s.sh
// brings up (run inside its network namespace, LATCHKEY_K8S_ENV set).

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/logtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
)

// kubeRig is the assembled verifier with the real token step and the
// narrow credential.
func kubeRig(tb testing.TB) *rig {
	env := k8stest.Load(tb)
	sim := tpmtest.Start(tb)
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		tb.Fatal(err)
	}
	_, cfg := verifierFiles(tb, map[string]any{"tpm": tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}},
		make([]byte, 32), "k8s-bench")
	cfg.Kubernetes = &app.Kubernetes{Kubeconfig: env["LATCHKEY_K8S_VERIFIER_KUBECONFIG"]}
	r := &rig{sim: sim, logs: &logtest.Buffer{}}
	startAssembled(tb, r, cfg, nil)
	return r
}

// BenchmarkK8sJoin is Hello to acknowledged Ticket, measured by the agent:
// TLS handshake, quote and activation on swtpm, validation, the identity
// binding and the token Secret write on the real API server (file
// discovery: no JWS wait). The first join of a run claims its node and
// disk, the rest rejoin them. Each run (Go calls the function for b.N = 1
// first) has its own software TPM, so it gets its own node name and disk
// UUID: the binding would refuse the old ones to a new TPM. It reports the
// median and p99 over b.N joins.
func BenchmarkK8sJoin(b *testing.B) {
	r := kubeRig(b)
	c := r.agent(b, r.issuer(b), time.Minute)
	disk := uuid.NewString()
	req := ticket.Request{NodeName: "bench-" + disk[:8], DiskUUID: disk, Role: latchkeyv1.Role_ROLE_WORKER}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		t, err := c.Get(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		if t.Token == "" {
			b.Fatal("no token minted")
		}
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
}
