// Package attest holds what every evidence variant shares: the Issuer
// (agent side) and Validator (verifier side) contracts, the verified result
// a validator returns, and the refusal error that carries a stable reason.
//
// Each variant lives in its own sub-package (attest/tpm, attest/snp) and
// implements both halves of the same evidence format, so the code that
// produces evidence and the code that checks it are read side by side.
// The attested-TLS binding both halves sign over is in attest/atls.
//
// # The validator contract: verification, then policy
//
// A Validator judges evidence in two steps, kept apart in its interface as
// go-tpm-tools keeps VerifyAttestation (which returns a machine state)
// apart from its policy evaluation:
//
//   - Verify establishes what the evidence proves: its encoding,
//     signatures, certificate chains to the policy's trust anchors, the
//     session binding, any challenge round trip, and the replay of event
//     logs. It returns a Verified whose State is the variant's typed
//     machine state; it compares nothing with reference values.
//   - CheckPolicy judges such a state against the reference values of the
//     policy the validator was built from (PCRs, boot components, SNP
//     measurement, guest policy, TCB). It does no cryptography and no I/O,
//     so any validator of the same variant can judge a state another one
//     verified: the verifier's shadow policy does exactly that.
//
// Validate is the two in order, the whole check of a join. The verifier
// calls the steps only through this interface and never names a variant,
// so a new variant, or a change to one variant's policy step, needs no
// edit outside its package. A State is opaque outside its variant but for
// its Variant and the verified keys it names (Keys, which a deny list
// matches), and, where the variant can seal, the facts of an offline
// grant (Sealer, sealer.go): only the CheckPolicy of the variant that
// made it interprets it, and a state of another variant, or none, is refused as INTERNAL
// (StateMismatch).
// Test doubles (attest/attesttest) implement the same two methods and go
// through the same path.
package attest

import (
	"context"
	"crypto/sha256"
	"errors"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// MaxEvidenceSize bounds Hello.evidence for every variant; each variant's
// own limit (tpm.MaxEvidenceSize 208 KiB with event logs,
// snp.MaxEvidenceSize 64 KiB) is at most this. The verifier's gRPC message
// limit is this plus room for the Hello's other fields.
const MaxEvidenceSize = 256 << 10

// BindingSize is the length of the session binding every variant carries as
// its user data (TPM qualifying data, the first half of SNP REPORT_DATA).
const BindingSize = 32

// Issuer produces evidence on the agent. One Issuer serves every attempt of
// a boot; each attempt gets its own Attestation so per-attempt device
// objects are released as soon as the attempt ends.
type Issuer interface {
	Variant() latchkeyv1.Variant
	// Attest makes evidence whose user data is binding (BindingSize bytes).
	Attest(ctx context.Context, binding []byte) (Attestation, error)
	// Close releases the device.
	Close() error
}

// Attestation is one attempt's evidence and whatever the attempt needs to
// answer the verifier's challenges.
type Attestation interface {
	// Evidence is the serialized variant-specific evidence message.
	Evidence() []byte
	// Respond answers one Challenge payload of the verifier.
	Respond(ctx context.Context, challenge []byte) ([]byte, error)
	// Close releases every object the attempt created on the device.
	Close() error
}

// RoundTrip sends a challenge payload to the agent and returns its answer.
// The verifier service provides it over the join stream.
type RoundTrip func(ctx context.Context, challenge []byte) ([]byte, error)

// Validator checks evidence on the verifier in the two steps the package
// doc describes. A Validator is built from one policy snapshot and is safe
// for concurrent use; a policy reload builds a new one.
type Validator interface {
	Variant() latchkeyv1.Variant
	// Verify verifies evidence bound to binding (signatures, chains to the
	// policy's trust anchors, the binding, challenges through rt, log
	// replay) and returns the verified state, with Verified.State set to
	// the variant's state. It applies no reference value. It returns only
	// verified data; every refusal is a *Refusal.
	Verify(ctx context.Context, evidence, binding []byte, rt RoundTrip) (*Verified, error)
	// CheckPolicy judges a state returned by Verify (of any validator of
	// the same variant) against this validator's reference values. nil is
	// accepted; every refusal is a *Refusal. A state of another variant,
	// or nil, is refused as INTERNAL (StateMismatch).
	CheckPolicy(st State) error
}

// Validate is v.Verify followed by v.CheckPolicy on the state it
// returned: every check of both, in their order, the first failure ending
// validation with its reason. It is the whole check of a join.
func Validate(ctx context.Context, v Validator, evidence, binding []byte, rt RoundTrip) (*Verified, error) {
	ver, err := v.Verify(ctx, evidence, binding, rt)
	if err != nil {
		return nil, err
	}
	if err := v.CheckPolicy(ver.State); err != nil {
		return nil, err
	}
	return ver, nil
}

// Verified is what a validator vouches for after every check passed.
type Verified struct {
	Variant latchkeyv1.Variant
	// EvidenceDigest is SHA-256 over the evidence bytes, for audit lines and
	// token descriptions.
	EvidenceDigest [sha256.Size]byte
	// Identity names the attested machine for humans (EK or chip ID).
	Identity string
	// MachineID is the stable machine identity the verifier binds disk
	// UUIDs and node names to (verifier/binding): "tpm-ek:sha256:<hex>"
	// (the trusted EK's SPKI), "tpm-ak:sha256:<hex>" (a pinned AK, whose
	// EK is not verified), or "snp-chip:<hex CHIP_ID>" optionally followed
	// by "/host-data:<hex>". Empty means the evidence names no stable
	// identity (an SNP report with CHIP_ID masked); such a machine is
	// refused wherever a binding is needed.
	MachineID string
	// State is the variant's parsed, verified machine state (*tpm.State,
	// *snp.State): what the variant's policy step (CheckPolicy) reads.
	// Outside its variant only its Variant and Keys are read.
	State State
}

// State is a variant's verified machine state. Each variant's Verify
// returns one and its policy step (CheckPolicy) compares it with reference
// values, so verification and policy stay apart, as go-tpm-tools keeps
// VerifyAttestation apart from its policy evaluation.
type State interface {
	// Variant names the variant whose verifier produced the state.
	Variant() latchkeyv1.Variant
	// Keys lists the verified keys the state identifies its machine by,
	// in the order a deny list checks them; none when it has none. It is
	// the one part of a state read outside its variant, so a deny list
	// needs no variant's type.
	Keys() []Key
}

// Key is a verified key a machine is known by.
type Key struct {
	Kind KeyKind
	// Value is the key as the policy file and MachineID spell it: the
	// "sha256:<hex>" SPKI hash of a TPM key, the lower-case hex CHIP_ID of
	// an SNP chip.
	Value string
}

// KeyKind names a kind of verified key; each is the prefix of the
// MachineID it makes ("tpm-ek:sha256:<hex>").
type KeyKind string

// The key kinds.
const (
	// KeyTPMEK is the endorsement key the AK was activated under.
	KeyTPMEK KeyKind = "tpm-ek"
	// KeyTPMAK is the attestation key that signed the quote.
	KeyTPMAK KeyKind = "tpm-ak"
	// KeySNPChip is the chip that signed the report (CHIP_ID, 64 bytes).
	KeySNPChip KeyKind = "snp-chip"
)

// StateMismatch is the refusal (INTERNAL) of a CheckPolicy given a state
// its variant did not make: a state of another variant (the detail names
// its Go type), a nil one, or none. It is a programming error of the
// caller, never a property of the evidence.
func StateMismatch(want latchkeyv1.Variant, got State) error {
	if got == nil {
		return Refuse(latchkeyv1.Reason_INTERNAL, "%s policy step given no verified state", want)
	}
	return Refuse(latchkeyv1.Reason_INTERNAL, "%s policy step cannot judge a %T state its Verify did not return", want, got)
}

// ErrDevice marks a failure of the evidence device itself (a TPM out of
// object memory or locked out, an SNP guest device that does not answer):
// not a verifier or policy matter, so the agent stops trying that boot and
// reports it with its own exit code.
var ErrDevice = errors.New("evidence device failure")

// EvidenceDigest hashes evidence for Verified.EvidenceDigest.
func EvidenceDigest(evidence []byte) [sha256.Size]byte { return sha256.Sum256(evidence) }
