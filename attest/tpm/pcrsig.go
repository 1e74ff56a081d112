package tpm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/latchkey/latchkey/attest/tpm/wire"
)

// PCR11Signature is one sha256-bank entry of the PCR signature JSON
// `systemd-measure sign` writes and systemd-stub passes to the booted
// system (/run/systemd/tpm2-pcr-signature.json):
//
//	{"sha256":[{"pcrs":[11],"pkfp":"<hex>","pol":"<hex>","sig":"<base64>"}, …]}
//
// One entry per boot phase. Entries are claims until a policy key verifies
// them (checkPCR11Signature); the evidence digest covers them.
type PCR11Signature struct {
	// KeyFingerprint (pkfp) is SHA-256 of the signing key as OpenSSL's
	// i2d_PublicKey encodes it (systemd's pubkey_fingerprint): the PKCS#1
	// RSAPublicKey DER, or an EC key's uncompressed point.
	KeyFingerprint [sha256.Size]byte
	// PolicyDigest (pol) is the TPM2_PolicyPCR digest of PCR 11 holding
	// the value signed for (PolicyPCRDigest).
	PolicyDigest [sha256.Size]byte
	// Signature (sig) is over SHA-256 of PolicyDigest, as
	// TPM2_PolicyAuthorize checks it (empty policyRef): RSA PKCS#1 v1.5
	// or ASN.1 ECDSA.
	Signature []byte
}

// decodePCRSignature parses the signature JSON, keeping the sha256 bank's
// entries for exactly PCR 11 (other banks and PCR sets say nothing about
// the SHA-256 PCR 11 the verifier checks).
func decodePCRSignature(raw []byte) ([]PCR11Signature, error) {
	if len(raw) > wire.MaxPCRSignatureSize {
		return nil, fmt.Errorf("pcr signature has %d bytes, limit %d", len(raw), wire.MaxPCRSignatureSize)
	}
	var banks map[string]json.RawMessage
	if err := json.Unmarshal(raw, &banks); err != nil {
		return nil, fmt.Errorf("pcr signature: %w", err)
	}
	bank, ok := banks["sha256"]
	if !ok {
		return nil, nil
	}
	var entries []struct {
		PCRs []int  `json:"pcrs"`
		PKFP string `json:"pkfp"`
		Pol  string `json:"pol"`
		Sig  string `json:"sig"`
	}
	if err := json.Unmarshal(bank, &entries); err != nil {
		return nil, fmt.Errorf("pcr signature sha256 bank: %w", err)
	}
	if len(entries) > maxPCRSignatureEntries {
		return nil, fmt.Errorf("pcr signature has %d sha256 entries, limit %d", len(entries), maxPCRSignatureEntries)
	}
	var out []PCR11Signature
	for i, e := range entries {
		if !slices.Equal(e.PCRs, []int{pcrKernel}) {
			continue
		}
		fp, err1 := hex.DecodeString(e.PKFP)
		pol, err2 := hex.DecodeString(e.Pol)
		sig, err3 := base64.StdEncoding.DecodeString(e.Sig)
		if err := errors.Join(err1, err2, err3); err != nil || len(fp) != sha256.Size || len(pol) != sha256.Size || len(sig) == 0 {
			return nil, fmt.Errorf("pcr signature sha256 entry %d: pkfp, pol or sig malformed", i)
		}
		out = append(out, PCR11Signature{KeyFingerprint: [sha256.Size]byte(fp), PolicyDigest: [sha256.Size]byte(pol), Signature: sig})
	}
	return out, nil
}

// ccPolicyPCR is TPM_CC_PolicyPCR.
const ccPolicyPCR = 0x0000017f

// PolicyPCRDigest is the TPM2 policy digest of a fresh session after
// TPM2_PolicyPCR over SHA-256 PCR 11 holding pcr11: SHA-256 of 32 zero
// bytes, TPM_CC_PolicyPCR, the TPML_PCR_SELECTION {sha256: {11}} and
// SHA-256 of the PCR value. It is the "pol" systemd-measure signs.
func PolicyPCRDigest(pcr11 [sha256.Size]byte) [sha256.Size]byte {
	pcrDigest := sha256.Sum256(pcr11[:])
	b := make([]byte, 0, 32+4+10+32)
	b = append(b, make([]byte, sha256.Size)...)
	b = binary.BigEndian.AppendUint32(b, ccPolicyPCR)
	// TPML_PCR_SELECTION: count 1, TPM_ALG_SHA256, sizeofSelect 3, bit 11.
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint16(b, 0x000b)
	b = append(b, 3, 0x00, 0x08, 0x00)
	b = append(b, pcrDigest[:]...)
	return sha256.Sum256(b)
}

// pcrSigner is a compiled pcr11Signers entry.
type pcrSigner struct {
	key crypto.PublicKey
	fp  [sha256.Size]byte
}

func compileSigner(pemText string) (pcrSigner, error) {
	der, err := parsePEMPublicKey(pemText)
	if err != nil {
		return pcrSigner{}, err
	}
	key, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return pcrSigner{}, fmt.Errorf("parse public key: %w", err)
	}
	var raw []byte
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return pcrSigner{}, fmt.Errorf("rsa key of %d bits, want at least 2048", k.N.BitLen())
		}
		raw = x509.MarshalPKCS1PublicKey(k)
	case *ecdsa.PublicKey:
		e, err := k.ECDH()
		if err != nil {
			return pcrSigner{}, fmt.Errorf("ecdsa key: %w", err)
		}
		raw = e.Bytes()
	default:
		return pcrSigner{}, fmt.Errorf("%T is not an rsa or ecdsa key", key)
	}
	return pcrSigner{key: key, fp: sha256.Sum256(raw)}, nil
}

// verify reports whether s signed pol.
func (s pcrSigner) verify(pol [sha256.Size]byte, sig []byte) bool {
	h := sha256.Sum256(pol[:])
	switch k := s.key.(type) {
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, h[:], sig) == nil
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, h[:], sig)
	}
	return false
}
