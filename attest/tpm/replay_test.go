package tpm_test

import (
	"context"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Evidence replayed on another session (no TPM needed to send it) is
// BINDING_MISMATCH before any trust work: under an EK-certificate policy
// whose CA did not issue this EK, and an EK hash policy that does not list
// it, the binding is still what refuses, and no challenge is sent. Were the
// EK chain or MakeCredential tried first, the reason would be UNTRUSTED_AK
// or a round trip would be asked for.
func TestReplayWithoutTPMIsBindingMismatchBeforeTrust(t *testing.T) {
	f := newFixture(t)
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	for name, p := range map[string]tpm.Policy{
		"ek ca (trusted)":      f.caPolicy(),
		"ek ca (other ca)":     {EKCARoots: []string{otherCAPEM(t)}},
		"ek hash not listed":   {EKPublicKeyHashes: []string{"sha256:" + zeroHex}},
		"ak pinned (not this)": {AKPublicKeyHashes: []string{"sha256:" + zeroHex}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := attest.Validate(context.Background(), newValidator(t, p), a.Evidence(), newBinding(t), noRoundTrip(t))
			if got != nil {
				t.Fatalf("refused validation returned %+v", got)
			}
			wantReason(t, err, latchkeyv1.Reason_BINDING_MISMATCH)
			if err.Error() != "BINDING_MISMATCH: quote qualifying data is not this session's binding" {
				t.Fatalf("err = %q", err)
			}
		})
	}
}

// The same evidence on its own session passes the binding and is then
// refused for trust: the order did not make the binding a way around it.
func TestBoundEvidenceStillNeedsTrust(t *testing.T) {
	f := newFixture(t)
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	_, err := attest.Validate(context.Background(), newValidator(t, tpm.Policy{EKCARoots: []string{otherCAPEM(t)}}), a.Evidence(), binding, noRoundTrip(t))
	wantReason(t, err, latchkeyv1.Reason_UNTRUSTED_AK)
}

const zeroHex = "0000000000000000000000000000000000000000000000000000000000000000"
