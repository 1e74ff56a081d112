package keys

import (
	"crypto/ecdsa"

	"github.com/latchkey/latchkey/attest/tpm/offline"
)

// GrantKey derives the offline grant key (docs/offline-unlock.md) from
// the current generation's master secret with offline.DeriveGrantKey:
// every replica holding the secret signs with the same key, and making
// another generation current (a rotation) changes it, so grants signed
// before no longer renew what nodes sealed. The key is never stored or
// logged.
func (d *Deriver) GrantKey() (*ecdsa.PrivateKey, error) {
	return offline.DeriveGrantKey(d.gens[d.current].master)
}
