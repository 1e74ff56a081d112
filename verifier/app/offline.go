package app

import (
	"github.com/latchkey/latchkey/attest/tpm/offline"
	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/service"
)

// grantSigner is the offline grant signer (docs/offline-unlock.md): an
// offline.Authorizer over the grant key of the current master-secret
// generation. It is built whatever the policy says, since a reload may
// turn offlineUnlock on; one that cannot be built is logged and leaves
// the verifier issuing no grants (the joins themselves are unaffected).
func (v *Verifier) grantSigner() service.GrantSigner {
	key, err := v.keys.GrantKey()
	if err != nil {
		v.deps.Logger.Error("offline grants disabled: no grant key", logkey.Error, err.Error())
		return nil
	}
	a, err := offline.NewAuthorizer(key)
	if err != nil {
		v.deps.Logger.Error("offline grants disabled: no grant signer", logkey.Error, err.Error())
		return nil
	}
	return a
}
