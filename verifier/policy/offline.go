package policy

import (
	"errors"
	"fmt"

	"github.com/latchkey/latchkey/attest/tpm/offline"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// OfflineUnlock is a variant's `offlineUnlock` section: a node whose join
// or re-attestation this policy accepts gets an offline grant
// (docs/offline-unlock.md) that its TPM honours for at most MaxBoots boots
// within MaxHours hours of TPM time since that attestation. Absent (or
// both zero) is off, the secure default: every boot needs a verifier.
type OfflineUnlock struct {
	MaxBoots uint32 `json:"maxBoots,omitempty"`
	MaxHours uint32 `json:"maxHours,omitempty"`
}

// Enabled reports whether o allows offline unlock at all.
func (o *OfflineUnlock) Enabled() bool { return o != nil && (o.MaxBoots != 0 || o.MaxHours != 0) }

// errSNPOffline refuses offlineUnlock in an snp section: an SEV-SNP guest
// has no TPM of its own to seal the disk key to and to enforce the bounds.
var errSNPOffline = errors.New("snp.offlineUnlock: SEV-SNP without a vTPM cannot seal; remove offlineUnlock from the snp section")

// checkOffline validates a tpm section's offlineUnlock: when set, both
// bounds must be at least 1 (half a bound is a typo, not a policy) and
// at most the grant limits the TPM policy is built for.
func checkOffline(o *OfflineUnlock) error {
	if !o.Enabled() {
		return nil
	}
	switch {
	case o.MaxBoots == 0:
		return errors.New("tpm.offlineUnlock.maxBoots: must be at least 1 when offlineUnlock is set")
	case o.MaxHours == 0:
		return errors.New("tpm.offlineUnlock.maxHours: must be at least 1 when offlineUnlock is set")
	case o.MaxBoots > offline.MaxBootsLimit:
		return fmt.Errorf("tpm.offlineUnlock.maxBoots: %d is above the limit of %d", o.MaxBoots, offline.MaxBootsLimit)
	case o.MaxHours > offline.MaxHoursLimit:
		return fmt.Errorf("tpm.offlineUnlock.maxHours: %d is above the limit of %d", o.MaxHours, offline.MaxHoursLimit)
	}
	return nil
}

// compileOffline fills s.Offline from p's sections.
func compileOffline(p *Policy, s *Snapshot) error {
	if p.SNP != nil && p.SNP.OfflineUnlock != nil {
		return errSNPOffline
	}
	if p.TPM == nil {
		return nil
	}
	if err := checkOffline(p.TPM.OfflineUnlock); err != nil {
		return err
	}
	if p.TPM.OfflineUnlock.Enabled() {
		s.Offline = map[latchkeyv1.Variant]OfflineUnlock{latchkeyv1.Variant_VARIANT_TPM: *p.TPM.OfflineUnlock}
	}
	return nil
}

// OfflineFor returns the offline bounds the snapshot sets for variant,
// and false when it allows no offline unlock for it.
func (s *Snapshot) OfflineFor(v latchkeyv1.Variant) (OfflineUnlock, bool) {
	if s == nil {
		return OfflineUnlock{}, false
	}
	o, ok := s.Offline[v]
	return o, ok
}

// OfflineSummary is what `policy check` says about offline unlock.
func (s *Snapshot) OfflineSummary() string {
	o, ok := s.OfflineFor(latchkeyv1.Variant_VARIANT_TPM)
	if !ok {
		return "offline unlock off"
	}
	return fmt.Sprintf("offline unlock on for tpm (at most %d boot(s) within %d hour(s) of an attestation)", o.MaxBoots, o.MaxHours)
}
