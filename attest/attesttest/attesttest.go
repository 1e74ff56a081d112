// Package attesttest is a fake evidence variant for unit tests of the
// join logic: its "evidence" is the binding itself plus a marker, and its
// challenge asks the agent to echo a random nonce. It proves nothing about
// a machine and must never be linked into a shipped binary; the real
// variants are tested against swtpm and go-sev-guest's signer.
package attesttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

var marker = []byte("fake-evidence:")

// Issuer is the agent half. Its switches change its behaviour.
type Issuer struct {
	V latchkeyv1.Variant
	// WrongAnswer makes Respond return a wrong echo.
	WrongAnswer bool
	// Calls counts Attest calls (tests check no evidence was made).
	Calls atomic.Int32
}

// Variant returns V (default VARIANT_TPM).
func (i *Issuer) Variant() latchkeyv1.Variant {
	if i.V == latchkeyv1.Variant_VARIANT_UNSPECIFIED {
		return latchkeyv1.Variant_VARIANT_TPM
	}
	return i.V
}

// Attest returns evidence carrying binding.
func (i *Issuer) Attest(_ context.Context, binding []byte) (attest.Attestation, error) {
	i.Calls.Add(1)
	return &attestation{ev: append(append([]byte{}, marker...), binding...), wrong: i.WrongAnswer}, nil
}

// Close does nothing.
func (i *Issuer) Close() error { return nil }

type attestation struct {
	ev    []byte
	wrong bool
}

func (a *attestation) Evidence() []byte { return a.ev }
func (a *attestation) Close() error     { return nil }

func (a *attestation) Respond(_ context.Context, ch []byte) ([]byte, error) {
	out := append([]byte{}, ch...)
	if a.wrong && len(out) > 0 {
		out[0] ^= 0xff
	}
	return out, nil
}

// Validator is the verifier half. It implements attest.Validator's two
// steps like the real variants, so a verifier test runs the same path: its
// Verify checks the marker, the binding and (with Challenge) the echo, and
// returns a *State; its CheckPolicy refuses a state it did not make as
// INTERNAL and otherwise refuses with PolicyRefusal when set. Its switches
// change its behaviour. It holds no lock (Log is shared by pointer), so a
// test may copy it to derive another policy's validator.
type Validator struct {
	V latchkeyv1.Variant
	// Challenge makes Verify run one echo round trip.
	Challenge bool
	// MachineID is the Verified.MachineID Verify returns (default
	// "fake:machine").
	MachineID string
	// PolicyRefusal, when not REASON_UNSPECIFIED, makes CheckPolicy refuse
	// every state with this reason (the policy step's refusal).
	PolicyRefusal latchkeyv1.Reason
	// Log, when set, records each step this validator runs.
	Log *Log
}

var _ attest.Validator = (*Validator)(nil)

// Variant returns V (default VARIANT_TPM).
func (v *Validator) Variant() latchkeyv1.Variant {
	return (&Issuer{V: v.V}).Variant()
}

// Verify accepts evidence that is the marker followed by binding.
func (v *Validator) Verify(ctx context.Context, evidence, binding []byte, rt attest.RoundTrip) (*attest.Verified, error) {
	ver, err := v.verify(ctx, evidence, binding, rt)
	var st attest.State
	if ver != nil {
		st = ver.State
	}
	v.Log.add(v, StepVerify, st)
	return ver, err
}

func (v *Validator) verify(ctx context.Context, evidence, binding []byte, rt attest.RoundTrip) (*attest.Verified, error) {
	body, ok := bytes.CutPrefix(evidence, marker)
	if !ok {
		return nil, attest.Refuse(latchkeyv1.Reason_MALFORMED, "not fake evidence")
	}
	if !bytes.Equal(body, binding) {
		return nil, attest.Refuse(latchkeyv1.Reason_BINDING_MISMATCH, "evidence is bound to another session or hello")
	}
	if v.Challenge {
		if err := echo(ctx, rt); err != nil {
			return nil, err
		}
	}
	id := v.MachineID
	if id == "" {
		id = "fake:machine"
	}
	return &attest.Verified{Variant: v.Variant(), EvidenceDigest: attest.EvidenceDigest(evidence), Identity: "fake", MachineID: id,
		State: &State{V: v.Variant(), Binding: bytes.Clone(binding)}}, nil
}

// CheckPolicy judges a *State of the validator's variant: PolicyRefusal,
// or accepted.
func (v *Validator) CheckPolicy(s attest.State) error {
	v.Log.add(v, StepCheckPolicy, s)
	st, ok := s.(*State)
	if !ok || st == nil || st.V != v.Variant() {
		return attest.StateMismatch(v.Variant(), s)
	}
	if v.PolicyRefusal != latchkeyv1.Reason_REASON_UNSPECIFIED {
		return attest.Refuse(v.PolicyRefusal, "fake policy refuses")
	}
	return nil
}

// State is the fake's verified state: the variant and the binding the
// evidence carried.
type State struct {
	V       latchkeyv1.Variant
	Binding []byte
}

// Variant returns V.
func (s *State) Variant() latchkeyv1.Variant { return s.V }

// Keys returns nil: the fake names its machine by MachineID only.
func (s *State) Keys() []attest.Key { return nil }

// The steps a Log records.
const (
	StepVerify      = "verify"
	StepCheckPolicy = "check-policy"
)

// Step is one call of a Validator: which validator, which step, and the
// state it returned (Verify; nil on a refusal) or was given (CheckPolicy).
type Step struct {
	Validator *Validator
	Step      string
	State     attest.State
}

// Log records the steps validators run, in order, for tests that check
// which path the verifier took. It is safe for concurrent use.
type Log struct {
	mu    sync.Mutex
	steps []Step
}

func (l *Log) add(v *Validator, step string, st attest.State) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.steps = append(l.steps, Step{Validator: v, Step: step, State: st})
}

// Steps returns a copy of the steps recorded so far.
func (l *Log) Steps() []Step {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.steps)
}

func echo(ctx context.Context, rt attest.RoundTrip) error {
	nonce := make([]byte, 16)
	rand.Read(nonce)
	got, err := rt(ctx, nonce)
	if err != nil {
		var r *attest.Refusal
		if errors.As(err, &r) {
			return err
		}
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "challenge: %w", err)
	}
	if !bytes.Equal(got, nonce) {
		return attest.Refuse(latchkeyv1.Reason_ACTIVATION_FAILED, "wrong challenge answer")
	}
	return nil
}
