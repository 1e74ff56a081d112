package app

import (
	"bytes"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// newOffline wires offline unlock: the TPM variant on a LUKS state disk
// (the token lives in its header). SEV-SNP without a vTPM cannot seal,
// and a key-only disk has no header; both boot as before. Whether a node
// may unlock offline at all is the verifier's decision: without a stored
// grant nothing changes.
func newOffline(cfg *config.Config, d disk.Stage) *boot.Offline {
	store, ok := d.(boot.TokenStore)
	if !ok || variant(cfg) != "tpm" {
		return nil
	}
	return &boot.Offline{Sealer: NewTPMSealer(cfg.TPM.Device), Store: store, After: cfg.Offline.After.Duration}
}

// NewTPMSealer is the boot's Sealer on the TPM at device (a path or
// tcp://HOST:PORT, as tpm.OpenDevice takes).
func NewTPMSealer(device string) boot.Sealer { return tpmSealer{device: device} }

// tpmSealer is boot.Sealer over attest/tpm/offline. Like the issuer it
// opens the TPM for each operation, so a swtpm (one connection at a
// time) and the kernel's resource manager see short sessions.
type tpmSealer struct{ device string }

func (s tpmSealer) with(f func(transport.TPM) error) error {
	tp, err := tpm.OpenDevice(s.device)
	if err != nil {
		return fmt.Errorf("offline: open TPM: %w", err)
	}
	defer tp.Close()
	return f(tp)
}

func decodeSealed(b []byte) (*offline.Sealed, error) {
	var s offline.Sealed
	if err := s.UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("offline token's sealed object: %w", err)
	}
	return &s, nil
}

// Seal seals key for grants like g.
func (s tpmSealer) Seal(key []byte, g *latchkeyv1.OfflineGrant) ([]byte, error) {
	var out []byte
	err := s.with(func(tp transport.TPM) error {
		sealed, err := offline.Seal(tp, key, g)
		if err != nil {
			return err
		}
		out, err = sealed.MarshalBinary()
		return err
	})
	return out, err
}

// Unseal asks the TPM for the key.
func (s tpmSealer) Unseal(b []byte, g *latchkeyv1.OfflineGrant) ([]byte, boot.OfflineStatus, error) {
	sealed, err := decodeSealed(b)
	if err != nil {
		return nil, boot.OfflineStatus{}, err
	}
	var key []byte
	var st offline.Status
	err = s.with(func(tp transport.TPM) error {
		key, st, err = offline.Unseal(tp, sealed, g)
		return err
	})
	return key, boot.OfflineStatus{Boot: st.Boot, MaxBoots: st.MaxBoots, HoursLeft: st.HoursLeft}, err
}

// Withdraw increments the grant counter.
func (s tpmSealer) Withdraw(b []byte) error {
	sealed, err := decodeSealed(b)
	if err != nil {
		return err
	}
	return s.with(func(tp transport.TPM) error { return offline.Withdraw(tp, sealed) })
}

// Renews: g is signed by the key the object was sealed for, under the
// same policy ref.
func (s tpmSealer) Renews(b []byte, g *latchkeyv1.OfflineGrant) bool {
	sealed, err := decodeSealed(b)
	if err != nil {
		return false
	}
	name, err := signerName(g.GetSignerPublic())
	return err == nil && bytes.Equal(name, sealed.Signer) && bytes.Equal(g.GetPolicyRef(), sealed.PolicyRef)
}

// signerName is the TPM name of a TPMT_PUBLIC.
func signerName(pub []byte) ([]byte, error) {
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](pub)
	if err != nil {
		return nil, err
	}
	n, err := tpm2.ObjectName(p)
	if err != nil {
		return nil, err
	}
	return n.Buffer, nil
}
