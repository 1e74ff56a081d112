package app_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/snp/snptest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// newSNPRig starts the assembled verifier with an snp-only policy that
// trusts the fake AMD roots of signer (go-sev-guest's test signer) and
// lists measurements.
func newSNPRig(t *testing.T, signer *snptest.Signer, measurements []string) *rig {
	t.Helper()
	pol := signer.Policy()
	if measurements != nil {
		pol.Measurements = measurements
	}
	_, cfg := verifierFiles(t, map[string]any{"snp": pol}, randomSecret(), "test-cluster")
	return startRig(t, nil, cfg)
}

func TestSNPJoinEndToEnd(t *testing.T) {
	signer := snptest.New(t)
	r := newSNPRig(t, signer, nil)
	c := r.agent(t, signer.Issuer(), 30*time.Second)
	first, err := c.Get(context.Background(), worker())
	if err != nil {
		t.Fatal(err)
	}
	again := worker()
	again.Rejoin = true
	second, err := c.Get(context.Background(), again)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.DiskKey) != 32 || !bytes.Equal(first.DiskKey, second.DiskKey) || first.Token == "" || second.Token != "" {
		t.Fatal("want a 32-byte key twice, a token on the first join only")
	}
	if !strings.Contains(r.logs.String(), "variant=VARIANT_SNP evidence_digest=sha256:") {
		t.Fatalf("audit log:\n%s", r.logs)
	}
}

func TestSNPMeasurementNotAllowedReleasesNothing(t *testing.T) {
	signer := snptest.New(t)
	other := strings.Repeat("ab", 48)
	r := newSNPRig(t, signer, []string{other})
	r.refusedWith(t, signer.Issuer(), worker(), latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED)
}

func TestSNPEnabledOnlyByPolicy(t *testing.T) {
	signer := snptest.New(t)
	tpmOnly := newRig(t, rigOpts{})
	tpmOnly.refusedWith(t, signer.Issuer(), worker(), latchkeyv1.Reason_UNKNOWN_VARIANT)
}
