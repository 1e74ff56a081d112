// Package offline lets a node unlock its state disk without a verifier,
// within bounds its own TPM enforces (docs/offline-unlock.md).
//
// The verifier side (Authorizer) signs a grant: the TPM policy digest of
// PolicyPCR(the accepted PCR values), PolicyCounterTimer(resetCount <=
// reset_count + max_boots) and PolicyCounterTimer(clock <= clock_ms +
// max_hours h), taken from the verified quote. It needs no TPM. The grant
// key is an ECDSA P-256 key the verifier derives from the master secret of
// its current generation with DeriveGrantKey (HKDF-SHA256, label
// "latchkey offline grant key v1"), so rotating the secret changes the key
// and no grant signed before the rotation opens a key sealed after it.
//
// The agent side seals the disk key once under the TPM's storage root key
// (the TCG ECC P-256 SRK template, recreated at every use) with the policy
// PolicyAuthorize(grant key, policy ref) then PolicyNV(the node's grant
// counter == its value at sealing). The grant counter is the NV counter
// index GrantCounterIndex in the owner hierarchy. Any later grant signed
// by the same key for the same machine renews it without a new seal;
// incrementing the counter (Withdraw) makes every copy of the sealed
// object useless, and a TPM never rolls a counter back, not even when the
// index is deleted and defined again. Every bound is checked by the TPM
// while it evaluates the policy session, never by agent code a modified
// boot could skip.
package offline

import (
	"errors"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Limits of a grant (the policy loader refuses larger bounds).
const (
	MaxBootsLimit = 1000
	MaxHoursLimit = 24 * 365
	// MaxPolicyRef is the TPM's bound on a policyRef (a digest's size).
	MaxPolicyRef = 32
)

// GrantCounterIndex is the NV handle of the grant counter Seal defines: in
// the range the TCG handle registry leaves to the TPM owner
// (0x01000000-0x013FFFFF), away from the TCG's own indices (EK
// certificates live at 0x01C0xxxx).
const GrantCounterIndex uint32 = 0x01384C4B

// Reasons a sealed key is not released; Unseal wraps exactly one of them.
var (
	// ErrBootsSpent: the TPM's resetCount passed reset_count + max_boots.
	ErrBootsSpent = errors.New("offline grant spent: boot bound reached")
	// ErrExpired: the TPM's clock passed clock_ms + max_hours.
	ErrExpired = errors.New("offline grant expired: time bound reached")
	// ErrPCRMismatch: this boot's PCRs differ from the granted values.
	ErrPCRMismatch = errors.New("this boot's measurements differ from the grant's")
	// ErrWithdrawn: the grant counter moved since sealing (the grant was
	// withdrawn), the counter index is gone or was redefined, or the
	// sealed object is not this TPM's.
	ErrWithdrawn = errors.New("offline grant withdrawn")
	// ErrBadGrant: the grant or the sealed object is malformed, or the
	// grant's signature is not the sealed object's signer's.
	ErrBadGrant = errors.New("offline grant invalid")
)

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

// Status is where a grant stands for this boot.
type Status struct {
	// Boot is this boot's number since the granting attestation (1 = the
	// first boot after it); MaxBoots the bound.
	Boot, MaxBoots uint32
	// HoursLeft of TPM time before the grant expires.
	HoursLeft float64
}

// grantRequest reads the signed fields of a grant back into a request.
func grantRequest(g *latchkeyv1.OfflineGrant) GrantRequest {
	return GrantRequest{
		PolicyRef:  g.GetPolicyRef(),
		PCRs:       g.GetPcrs(),
		ResetCount: g.GetResetCount(),
		ClockMS:    g.GetClockMs(),
		MaxBoots:   g.GetMaxBoots(),
		MaxHours:   g.GetMaxHours(),
	}
}
