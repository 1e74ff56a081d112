package service_test

import (
	"context"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/policy"
)

// The service runs a validator only through attest.Validator's two steps;
// the attesttest double implements them like the real variants, so these
// tests show the path every variant takes.

// candidate is a PolicyNext snapshot whose TPM validator is v.
func candidate(v attest.Validator) *policy.Snapshot {
	return &policy.Snapshot{Digest: "sha256:next", Validators: map[latchkeyv1.Variant]attest.Validator{latchkeyv1.Variant_VARIANT_TPM: v}}
}

// wantSteps checks the steps recorded and that every one of them saw the
// one state the first Verify returned.
func wantSteps(t *testing.T, got []attesttest.Step, want ...attesttest.Step) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("steps %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Validator != want[i].Validator || got[i].Step != want[i].Step {
			t.Fatalf("step %d is %+v, want %+v (all: %+v)", i, got[i], want[i], got)
		}
		if got[i].State == nil || got[i].State != got[0].State {
			t.Fatalf("step %d judged state %v, Verify returned %v", i, got[i].State, got[0].State)
		}
	}
}

// A join is the enforced validator's Verify, then its CheckPolicy on that
// state; the shadow is the candidate's CheckPolicy on the same state, and
// its refusal only reports.
func TestJoinIsVerifyThenCheckPolicyThenShadow(t *testing.T) {
	log := &attesttest.Log{}
	enforced := &attesttest.Validator{Challenge: true, Log: log}
	next := &attesttest.Validator{PolicyRefusal: latchkeyv1.Reason_PCR_MISMATCH, Log: log}
	e := startVerifier(t, envOpt{validator: enforced, next: candidate(next)})
	if _, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), worker(diskA)); err != nil {
		t.Fatalf("join: %v", err)
	}
	wantSteps(t, log.Steps(),
		attesttest.Step{Validator: enforced, Step: attesttest.StepVerify},
		attesttest.Step{Validator: enforced, Step: attesttest.StepCheckPolicy},
		attesttest.Step{Validator: next, Step: attesttest.StepCheckPolicy})
	if !strings.Contains(e.logs.String(), "shadow_decision=refused shadow_reason=PCR_MISMATCH shadow_policy=sha256:next") {
		t.Fatalf("audit line without the shadow refusal:\n%s", e.logs)
	}
}

// The enforced policy step's refusal is the join's, with its detail, and
// the shadow is not consulted for a refused join.
func TestJoinRefusedByPolicyStep(t *testing.T) {
	log := &attesttest.Log{}
	enforced := &attesttest.Validator{PolicyRefusal: latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED, Log: log}
	next := &attesttest.Validator{Log: log}
	e := startVerifier(t, envOpt{validator: enforced, next: candidate(next)})
	_, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), worker(diskA))
	if r := refusal(t, err); r != latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED || !strings.Contains(err.Error(), "fake policy refuses") {
		t.Fatalf("got %v (%v), want the policy step's refusal", r, err)
	}
	wantSteps(t, log.Steps(),
		attesttest.Step{Validator: enforced, Step: attesttest.StepVerify},
		attesttest.Step{Validator: enforced, Step: attesttest.StepCheckPolicy})
}

// Evidence Verify refuses never reaches a policy step, enforced or shadow.
func TestJoinVerifyRefusalSkipsPolicySteps(t *testing.T) {
	log := &attesttest.Log{}
	enforced := &attesttest.Validator{Challenge: true, Log: log}
	e := startVerifier(t, envOpt{validator: enforced, next: candidate(&attesttest.Validator{Log: log})})
	_, err := clientOnce(t, e, &attesttest.Issuer{WrongAnswer: true}).Get(context.Background(), worker(diskA))
	if r := refusal(t, err); r != latchkeyv1.Reason_ACTIVATION_FAILED || !strings.Contains(err.Error(), "wrong challenge answer") {
		t.Fatalf("got %v (%v), want ACTIVATION_FAILED", r, err)
	}
	if steps := log.Steps(); len(steps) != 1 || steps[0].Validator != enforced || steps[0].Step != attesttest.StepVerify || steps[0].State != nil {
		t.Fatalf("steps %+v, want only the refused verify", steps)
	}
}

// A re-attestation verifies, runs the shadow, then the enforced policy
// step, all on one state; a policy-step refusal of authenticated evidence
// is recorded as refused with its reason.
func TestReattestRecordsPolicyStepRefusal(t *testing.T) {
	var rs *recordingStore
	sp := &swapPolicy{}
	log := &attesttest.Log{}
	next := &attesttest.Validator{Log: log}
	e := startVerifier(t, envOpt{minter: &fakeMinter{}, policy: sp, next: candidate(next), store: func(s binding.Store) binding.Store {
		rs = &recordingStore{Store: s}
		return rs
	}})
	c := client(t, e, &attesttest.Issuer{})
	if _, err := c.Get(context.Background(), worker(diskA)); err != nil {
		t.Fatalf("join: %v", err)
	}
	refusing := &attesttest.Validator{PolicyRefusal: latchkeyv1.Reason_PCR_MISMATCH, Log: log}
	snap := *sp.Current()
	snap.Validators = map[latchkeyv1.Variant]attest.Validator{latchkeyv1.Variant_VARIANT_TPM: refusing}
	sp.cur.Store(&snap)
	re := worker(diskA)
	re.Rejoin, re.Reattest = true, true
	_, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), re)
	if r := refusal(t, err); r != latchkeyv1.Reason_PCR_MISMATCH || !strings.Contains(err.Error(), "fake policy refuses") {
		t.Fatalf("got %v (%v), want the policy step's refusal", r, err)
	}
	steps := log.Steps()
	if len(steps) != 4 {
		t.Fatalf("steps %+v, want the join's shadow step and three of the re-attestation", steps)
	}
	wantSteps(t, steps[1:],
		attesttest.Step{Validator: refusing, Step: attesttest.StepVerify},
		attesttest.Step{Validator: next, Step: attesttest.StepCheckPolicy},
		attesttest.Step{Validator: refusing, Step: attesttest.StepCheckPolicy})
	recs := rs.recorded()
	if len(recs) != 1 || recs[0].Decision != binding.DecisionRefused || recs[0].Reason != "PCR_MISMATCH" ||
		recs[0].ShadowDecision != "accepted" || recs[0].ShadowReason != "NONE" {
		t.Fatalf("recorded %+v, want one refused result with reason PCR_MISMATCH and the shadow's acceptance", recs)
	}
}
