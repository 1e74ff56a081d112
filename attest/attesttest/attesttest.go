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

// Validator is the verifier half.
type Validator struct {
	V latchkeyv1.Variant
	// Challenge makes Validate run one echo round trip.
	Challenge bool
	// MachineID is the Verified.MachineID Validate returns (default
	// "fake:machine").
	MachineID string
}

// Variant returns V (default VARIANT_TPM).
func (v *Validator) Variant() latchkeyv1.Variant {
	return (&Issuer{V: v.V}).Variant()
}

// Validate accepts evidence that is the marker followed by binding.
func (v *Validator) Validate(ctx context.Context, evidence, binding []byte, rt attest.RoundTrip) (*attest.Verified, error) {
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
	return &attest.Verified{Variant: v.Variant(), EvidenceDigest: attest.EvidenceDigest(evidence), Identity: "fake", MachineID: id}, nil
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
