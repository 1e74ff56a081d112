package app_test

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/verifier/app"
)

// A candidate policy (policyNext) that no longer lists PCR 14's value:
// on swtpm, the join and the re-attestation are accepted by the enforced
// policy (the node gets its key), and the audit lines and the metric
// carry the shadow refusal with its reason.
func TestShadowPolicyReportsWouldBeRefusal(t *testing.T) {
	sim := tpmtest.Start(t)
	dir := t.TempDir()
	ref, err := tpm.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	pol := tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}
	writeYAML(t, filepath.Join(dir, "policy.yaml"), map[string]any{"apiVersion": "latchkey/v1", "tpm": pol})
	next := tpm.Policy{PCRs: map[int][]string{}, EKCARoots: sim.EKCARootsPEM}
	for k, v := range ref.PCRs {
		next.PCRs[k] = v
	}
	next.PCRs[14] = []string{strings.Repeat("ab", 32)}
	writeYAML(t, filepath.Join(dir, "next.yaml"), map[string]any{"apiVersion": "latchkey/v1", "tpm": next})
	secret := make([]byte, 32)
	rand.Read(secret)
	os.WriteFile(filepath.Join(dir, "master"), secret, 0o600)
	addr := freeAddr(t)
	cfg := &app.Config{Policy: filepath.Join(dir, "policy.yaml"), PolicyNext: filepath.Join(dir, "next.yaml"),
		MasterSecretFile: filepath.Join(dir, "master"), ClusterSalt: "shadow", StateDir: filepath.Join(dir, "state"),
		AdminSocket: "-", MetricsListen: addr}
	r := startRig(t, sim, cfg)
	c := r.agent(t, r.issuer(t), time.Minute)
	tk, err := c.Get(context.Background(), worker())
	if err != nil || len(tk.DiskKey) != 32 || tk.Token == "" {
		t.Fatalf("join under the enforced policy: %v", err)
	}
	re := worker()
	re.Rejoin, re.Reattest = true, true
	if _, err := c.Get(context.Background(), re); err != nil {
		t.Fatalf("re-attestation under the enforced policy: %v\n%s", err, r.logs)
	}
	logs := r.logs.String()
	for _, purpose := range []string{"purpose=join", "purpose=reattest"} {
		found := false
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, `msg="join decision"`) && strings.Contains(line, purpose) {
				found = true
				if !strings.Contains(line, "result=accepted") || !strings.Contains(line, "shadow_decision=refused shadow_reason=PCR_MISMATCH") {
					t.Fatalf("%s audit line: %s", purpose, line)
				}
			}
		}
		if !found {
			t.Fatalf("no %s audit line:\n%s", purpose, logs)
		}
	}
	if m := scrape(t, addr); !strings.Contains(m, `latchkey_verifier_shadow_decisions_total{decision="refused",reason="pcr_mismatch",variant="tpm"} 2`) {
		t.Fatalf("metrics lack the two shadow refusals:\n%s", grepLines(m, "shadow"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
