package app_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/yamltest"
)

// A candidate policy (policyNext) that no longer lists PCR 14's value:
// on swtpm, the join and the re-attestation are accepted by the enforced
// policy (the node gets its key), and the audit lines and the metric
// carry the shadow refusal with its reason.
func TestShadowPolicyReportsWouldBeRefusal(t *testing.T) {
	sim := tpmtest.Start(t)
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	pol := tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}
	dir, cfg := verifierFiles(t, map[string]any{"tpm": pol}, randomSecret(), "shadow")
	next := tpm.Policy{PCRs: map[int][]string{}, EKCARoots: sim.EKCARootsPEM}
	for k, v := range ref.PCRs {
		next.PCRs[k] = v
	}
	next.PCRs[14] = []string{strings.Repeat("ab", 32)}
	yamltest.Write(t, filepath.Join(dir, "next.yaml"), map[string]any{"apiVersion": "latchkey/v1", "tpm": next})
	addr := freeAddr(t)
	cfg.PolicyNext, cfg.MetricsListen = filepath.Join(dir, "next.yaml"), addr
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
