package tpm

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// akTemplate is the attestation key: ECC P-256, ECDSA-SHA256, restricted
// signing (the TPM signs only structures it produced itself), and bound to
// this TPM (fixedTPM, fixedParent, sensitiveDataOrigin). userWithAuth with
// an empty password lets the agent use it without a policy session.
var akTemplate = tpm2.TPMTPublic{
	Type:    tpm2.TPMAlgECC,
	NameAlg: tpm2.TPMAlgSHA256,
	ObjectAttributes: tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		Restricted:          true,
		SignEncrypt:         true,
	},
	Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
		Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
		Scheme: tpm2.TPMTECCScheme{
			Scheme: tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA,
				&tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
		},
		CurveID: tpm2.TPMECCNistP256,
		KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
	}),
	Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
		Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
	}),
}

// ekPersistentHandle is where the TCG provisioning guidance (and
// swtpm_setup, tpm2_createek, Windows) persists the RSA-2048 EK.
const ekPersistentHandle = tpm2.TPMHandle(0x81010001)

// key is a loaded object and its public area in wire format.
type key struct {
	handle tpm2.TPMHandle
	name   tpm2.TPM2BName
	public []byte // TPMT_PUBLIC
	// persistent keys belong to the TPM's owner and are never flushed.
	persistent bool
}

// loadEK returns the RSA-2048 EK of the TCG default template, the key the
// EK certificate in NV 0x01c00002 certifies. It uses the persisted copy
// when one with exactly that template is present: deriving an RSA primary
// key means a prime search, tens of milliseconds on swtpm and seconds on
// some hardware TPMs, at every boot.
func loadEK(tp transport.TPM) (*key, error) {
	if k := persistentEK(tp); k != nil {
		return k, nil
	}
	return createEK(tp)
}

// persistentEK returns the key at ekPersistentHandle if its public area
// is the default EK template's (apart from the key itself), else nil.
func persistentEK(tp transport.TPM) *key {
	rsp, err := tpm2.ReadPublic{ObjectHandle: ekPersistentHandle}.Execute(tp)
	if err != nil {
		return nil
	}
	pub, err := rsp.OutPublic.Contents()
	if err != nil {
		return nil
	}
	shape := *pub
	shape.Unique = tpm2.RSAEKTemplate.Unique
	if !bytes.Equal(tpm2.Marshal(shape), tpm2.Marshal(tpm2.RSAEKTemplate)) {
		return nil
	}
	return &key{handle: ekPersistentHandle, name: rsp.Name, public: rsp.OutPublic.Bytes(), persistent: true}
}

// createEK derives the EK from the endorsement seed.
func createEK(tp transport.TPM) (*key, error) {
	k, err := createPrimary(tp, tpm2.TPMRHEndorsement, tpm2.RSAEKTemplate)
	if err != nil {
		return nil, fmt.Errorf("create ek: %w", err)
	}
	return k, nil
}

// createAK derives the attestation key from the endorsement seed. The
// hierarchy matters to offline unlock: TPM2_Quote reports the TPM's own
// resetCount and restartCount only for a signing key of the endorsement
// or platform hierarchy and obfuscates them for any other (TPM 2.0 Part
// 3, 18.1), and an offline grant counts its boots from the quoted
// resetCount. Like the EK when it is not persisted, it needs the
// endorsement hierarchy's authorization to be empty.
func createAK(tp transport.TPM) (*key, error) {
	k, err := createPrimary(tp, tpm2.TPMRHEndorsement, akTemplate)
	if err != nil {
		return nil, fmt.Errorf("create ak: %w", err)
	}
	return k, nil
}

func createPrimary(tp transport.TPM, hierarchy tpm2.TPMHandle, tmpl tpm2.TPMTPublic) (*key, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: hierarchy, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(tmpl),
	}.Execute(tp)
	if err != nil {
		return nil, err
	}
	k := &key{handle: rsp.ObjectHandle, name: rsp.Name, public: rsp.OutPublic.Bytes()}
	if len(k.public) == 0 {
		return nil, errors.Join(errors.New("tpm returned an empty public area"), flush(tp, k))
	}
	return k, nil
}

// flush unloads a transient k; a nil or persistent key is a no-op so
// error paths can flush blindly.
func flush(tp transport.TPM, k *key) error {
	if k == nil || k.persistent {
		return nil
	}
	if _, err := (tpm2.FlushContext{FlushHandle: k.handle}).Execute(tp); err != nil {
		return fmt.Errorf("flush %#x: %w", uint32(k.handle), err)
	}
	return nil
}
