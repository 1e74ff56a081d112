// Package offline lets a node unlock its state disk without a verifier,
// within bounds its own TPM enforces (docs/offline-unlock.md).
//
// The verifier side (Authorizer) signs a grant: the TPM policy digest of
// PolicyPCR(the accepted PCR values), PolicyCounterTimer(resetCount <=
// reset_count + max_boots) and PolicyCounterTimer(clock <= clock_ms +
// max_hours h), taken from the verified quote. It needs no TPM.
//
// The agent side seals the disk key once under the TPM's storage root key
// with the policy PolicyAuthorize(grant key, policy ref) then PolicyNV(the
// node's grant counter == its value at sealing). Any later grant signed by
// the same key for the same machine renews it without a new seal;
// incrementing the counter (Withdraw) makes every copy of the sealed
// object useless. Every bound is checked by the TPM while it evaluates the
// policy session, never by agent code a modified boot could skip.
//
// THIS FILE IS THE CONTRACT other packages are written against; its
// bodies are placeholders until the implementation lands.
package offline

import (
	"crypto"
	"errors"

	"github.com/google/go-tpm/tpm2/transport"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Limits of a grant (the policy loader refuses larger bounds).
const (
	MaxBootsLimit = 1000
	MaxHoursLimit = 24 * 365
	// MaxPolicyRef is the TPM's bound on a policyRef (a digest's size).
	MaxPolicyRef = 32
)

// Reasons a sealed key is not released; Unseal wraps exactly one of them.
var (
	// ErrBootsSpent: the TPM's resetCount passed reset_count + max_boots.
	ErrBootsSpent = errors.New("offline grant spent: boot bound reached")
	// ErrExpired: the TPM's clock passed clock_ms + max_hours.
	ErrExpired = errors.New("offline grant expired: time bound reached")
	// ErrPCRMismatch: this boot's PCRs differ from the granted values.
	ErrPCRMismatch = errors.New("this boot's measurements differ from the grant's")
	// ErrWithdrawn: the grant counter moved since sealing (the grant was
	// withdrawn) or the sealed object is not this TPM's.
	ErrWithdrawn = errors.New("offline grant withdrawn")
	// ErrBadGrant: the grant is malformed or its signature is not the
	// sealed object's signer's.
	ErrBadGrant = errors.New("offline grant invalid")
	errTODO     = errors.New("offline: not implemented")
)

// PolicyRef binds a grant to one machine (its stable identity, e.g. the
// EK's public key digest the verifier binds) and one disk: SHA-256 over
// both, so a grant signed for one node cannot renew another's sealed key.
func PolicyRef(machineID []byte, diskUUID string) []byte { return nil }

// GrantRequest is what the verifier read from a verified quote and its
// policy.
type GrantRequest struct {
	PolicyRef  []byte
	PCRs       map[uint32][]byte // SHA-256 values
	ResetCount uint32
	ClockMS    uint64
	MaxBoots   uint32
	MaxHours   uint32
}

// Authorizer signs grants with the verifier's grant key.
type Authorizer struct{}

// NewAuthorizer takes an ECDSA P-256 signer (the grant key).
func NewAuthorizer(signer crypto.Signer) (*Authorizer, error) { return nil, errTODO }

// Grant signs a grant for req.
func (a *Authorizer) Grant(req GrantRequest) (*latchkeyv1.OfflineGrant, error) {
	return nil, errTODO
}

// Sealed is the node's sealed copy of its disk key: what the agent stores
// (in the state disk's latchkey-offline LUKS2 token) between boots.
type Sealed struct {
	// Public and Private are the sealed object's TPM2B_PUBLIC and
	// TPM2B_PRIVATE under the storage root key.
	Public, Private []byte
	// NVIndex is the grant counter; Counter its value at sealing.
	NVIndex uint32
	Counter uint64
	// Signer is the TPM name of the grant key; PolicyRef the machine and
	// disk binding.
	Signer    []byte
	PolicyRef []byte
}

// MarshalBinary and UnmarshalBinary give Sealed a versioned, size-bounded
// encoding; UnmarshalBinary validates every field.
func (s *Sealed) MarshalBinary() ([]byte, error) { return nil, errTODO }
func (s *Sealed) UnmarshalBinary(b []byte) error { return errTODO }

// Status is where a grant stands for this boot.
type Status struct {
	// Boot is this boot's number since the granting attestation (1 = the
	// first boot after it); MaxBoots the bound.
	Boot, MaxBoots uint32
	// HoursLeft of TPM time before the grant expires.
	HoursLeft float64
}

// Seal seals key under tp's storage root key for grants signed like g
// (same signer, same policy ref), defining the grant counter if needed.
func Seal(tp transport.TPM, key []byte, g *latchkeyv1.OfflineGrant) (*Sealed, error) {
	return nil, errTODO
}

// Unseal releases the key if this boot satisfies g as the TPM judges it,
// or returns an error wrapping one of the Err values naming the bound.
func Unseal(tp transport.TPM, s *Sealed, g *latchkeyv1.OfflineGrant) ([]byte, Status, error) {
	return nil, Status{}, errTODO
}

// Withdraw increments the grant counter: every copy of s stops opening.
func Withdraw(tp transport.TPM, s *Sealed) error { return errTODO }
