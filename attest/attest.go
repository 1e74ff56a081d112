// Package attest holds what every evidence variant shares: the Issuer
// (agent side) and Validator (verifier side) contracts, the verified result
// a validator returns, and the refusal error that carries a stable reason.
//
// Each variant lives in its own sub-package (attest/tpm, attest/snp) and
// implements both halves of the same evidence format, so the code that
// produces evidence and the code that checks it are read side by side.
// The attested-TLS binding both halves sign over is in attest/atls.
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

// Validator checks evidence on the verifier. A Validator is built from one
// policy snapshot and is safe for concurrent use; a policy reload builds a
// new one.
type Validator interface {
	Variant() latchkeyv1.Variant
	// Validate verifies evidence bound to binding against the policy the
	// validator was built from, using rt for any challenge round trip. It
	// returns only verified data; every failure is a *Refusal.
	Validate(ctx context.Context, evidence, binding []byte, rt RoundTrip) (*Verified, error)
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
	// *snp.State): what the variant's policy step reads.
	State State
}

// State is a variant's verified machine state. Each variant's Verify
// returns one and its policy step (CheckPolicy) compares it with reference
// values, so verification and policy stay apart, as go-tpm-tools keeps
// VerifyAttestation apart from its policy evaluation.
type State interface {
	// Variant names the variant whose verifier produced the state.
	Variant() latchkeyv1.Variant
}

// ErrDevice marks a failure of the evidence device itself (a TPM out of
// object memory or locked out, an SNP guest device that does not answer):
// not a verifier or policy matter, so the agent stops trying that boot and
// reports it with its own exit code.
var ErrDevice = errors.New("evidence device failure")

// EvidenceDigest hashes evidence for Verified.EvidenceDigest.
func EvidenceDigest(evidence []byte) [sha256.Size]byte { return sha256.Sum256(evidence) }
