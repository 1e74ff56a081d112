package tpm_test

import (
	"context"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/attest/tpm"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// CheckPolicy judges only a *tpm.State: a state that claims VARIANT_TPM
// but is another package's, a nil one, or none is refused as INTERNAL,
// while the state Verify returned passes the same policy.
func TestCheckPolicyRefusesForeignState(t *testing.T) {
	c := newCrafted(t, true)
	binding := newBinding(t)
	v := newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{c.akHash}, PCRs: map[int][]string{0: {strings.Repeat("00", 32)}}})
	ver, err := v.Verify(context.Background(), c.evidence(t, binding), binding, noRoundTrip(t))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if err := v.CheckPolicy(ver.State); err != nil {
		t.Fatalf("CheckPolicy of the verified state: %v", err)
	}
	for _, tc := range []struct {
		name string
		st   attest.State
		want string
	}{
		{"none", nil, "INTERNAL: VARIANT_TPM policy step given no verified state"},
		{"nil tpm state", (*tpm.State)(nil), "INTERNAL: VARIANT_TPM policy step cannot judge a *tpm.State state its Verify did not return"},
		{"claims tpm", &attesttest.State{V: latchkeyv1.Variant_VARIANT_TPM},
			"INTERNAL: VARIANT_TPM policy step cannot judge a *attesttest.State state its Verify did not return"},
		{"snp", &attesttest.State{V: latchkeyv1.Variant_VARIANT_SNP},
			"INTERNAL: VARIANT_TPM policy step cannot judge a *attesttest.State state its Verify did not return"},
	} {
		err := v.CheckPolicy(tc.st)
		if attest.ReasonOf(err) != latchkeyv1.Reason_INTERNAL || err.Error() != tc.want {
			t.Errorf("%s: CheckPolicy = %v, want %q", tc.name, err, tc.want)
		}
	}
}
