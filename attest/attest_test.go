package attest_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func fakeEvidence(t *testing.T, binding []byte) []byte {
	t.Helper()
	a, err := (&attesttest.Issuer{}).Attest(context.Background(), binding)
	if err != nil {
		t.Fatal(err)
	}
	return a.Evidence()
}

// Validate is Verify, then CheckPolicy of the same validator on the very
// state Verify returned.
func TestValidateIsVerifyThenCheckPolicy(t *testing.T) {
	log := &attesttest.Log{}
	v := &attesttest.Validator{Log: log}
	binding := bytes.Repeat([]byte{7}, attest.BindingSize)
	got, err := attest.Validate(context.Background(), v, fakeEvidence(t, binding), binding, nil)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	steps := log.Steps()
	if len(steps) != 2 || steps[0].Step != attesttest.StepVerify || steps[1].Step != attesttest.StepCheckPolicy ||
		steps[0].Validator != v || steps[1].Validator != v {
		t.Fatalf("steps %+v, want verify then check-policy of one validator", steps)
	}
	if got.State == nil || steps[0].State != got.State || steps[1].State != got.State {
		t.Fatalf("check-policy judged %v, Verify returned %v", steps[1].State, got.State)
	}
}

// A refusal of Verify ends validation: the policy step never sees
// unverified evidence.
func TestValidateStopsAtVerifyRefusal(t *testing.T) {
	log := &attesttest.Log{}
	v := &attesttest.Validator{Log: log}
	binding := bytes.Repeat([]byte{7}, attest.BindingSize)
	other := bytes.Repeat([]byte{8}, attest.BindingSize)
	got, err := attest.Validate(context.Background(), v, fakeEvidence(t, other), binding, nil)
	if got != nil || err == nil || err.Error() != "BINDING_MISMATCH: evidence is bound to another session or hello" {
		t.Fatalf("Validate = %v, %v; want the binding refusal", got, err)
	}
	if steps := log.Steps(); len(steps) != 1 || steps[0].Step != attesttest.StepVerify || steps[0].State != nil {
		t.Fatalf("steps %+v, want only a refused verify", steps)
	}
}

// A refusal of the policy step is Validate's refusal, and no result is
// returned with it.
func TestValidatePolicyRefusal(t *testing.T) {
	v := &attesttest.Validator{PolicyRefusal: latchkeyv1.Reason_PCR_MISMATCH}
	binding := bytes.Repeat([]byte{7}, attest.BindingSize)
	got, err := attest.Validate(context.Background(), v, fakeEvidence(t, binding), binding, nil)
	if got != nil || err == nil || err.Error() != "PCR_MISMATCH: fake policy refuses" {
		t.Fatalf("Validate = %v, %v; want the policy refusal", got, err)
	}
}

// A policy step given a state its variant did not make refuses it as
// INTERNAL, whatever variant the state claims.
func TestCheckPolicyRefusesForeignState(t *testing.T) {
	v := &attesttest.Validator{}
	for _, tc := range []struct {
		name string
		st   attest.State
		want string
	}{
		{"none", nil, "INTERNAL: VARIANT_TPM policy step given no verified state"},
		{"typed nil", (*attesttest.State)(nil), "INTERNAL: VARIANT_TPM policy step cannot judge a *attesttest.State state its Verify did not return"},
		{"another variant", &attesttest.State{V: latchkeyv1.Variant_VARIANT_SNP},
			"INTERNAL: VARIANT_TPM policy step cannot judge a *attesttest.State state its Verify did not return"},
	} {
		err := v.CheckPolicy(tc.st)
		if attest.ReasonOf(err) != latchkeyv1.Reason_INTERNAL || err.Error() != tc.want {
			t.Errorf("%s: CheckPolicy = %v, want %q", tc.name, err, tc.want)
		}
	}
	// The same variant's state is judged.
	if err := v.CheckPolicy(&attesttest.State{V: latchkeyv1.Variant_VARIANT_TPM}); err != nil {
		t.Errorf("CheckPolicy of its own variant's state: %v", err)
	}
}
