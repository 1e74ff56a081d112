package offline

import (
	"errors"

	"github.com/google/go-tpm/tpm2/transport"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

var errTODO = errors.New("offline: not implemented")

// MarshalBinary and UnmarshalBinary give Sealed a versioned, size-bounded
// encoding; UnmarshalBinary validates every field.
func (s *Sealed) MarshalBinary() ([]byte, error) { return nil, errTODO }
func (s *Sealed) UnmarshalBinary(b []byte) error { return errTODO }

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
