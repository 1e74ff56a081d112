package offline

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"

	"github.com/google/go-tpm/tpm2"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

const (
	// grantKeyLabel is the HKDF info of the grant key: a new label is a
	// new key.
	grantKeyLabel = "latchkey offline grant key v1"
	// policyRefLabel prefixes a policy ref's preimage.
	policyRefLabel = "latchkey-offline-v1"
	// minMasterSecret is the least secret DeriveGrantKey takes (the
	// verifier's master secrets are at least this long).
	minMasterSecret = 32
	// p256Size is the octet length of a P-256 coordinate or scalar.
	p256Size = 32
	// maxSignerPublic bounds a signer_public before it is parsed (an ECC
	// P-256 TPMT_PUBLIC is about 90 bytes).
	maxSignerPublic = 512
	// maxSignature bounds a grant's TPMT_SIGNATURE (ECDSA P-256: 72).
	maxSignature = 256
)

// PolicyRef binds a grant to one machine (its stable identity, e.g. the
// EK's public key digest the verifier binds) and one disk: SHA-256 over
// both, so a grant signed for one node cannot renew another's sealed key.
// Both parts are length-prefixed, so no two pairs share a preimage.
func PolicyRef(machineID []byte, diskUUID string) []byte {
	h := sha256.New()
	h.Write([]byte(policyRefLabel))
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(machineID))))
	h.Write(machineID)
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(diskUUID))))
	h.Write([]byte(diskUUID))
	return h.Sum(nil)
}

// DeriveGrantKey derives the verifier's grant key from a master secret:
// HKDF-SHA256 with the info "latchkey offline grant key v1", expanded to
// 40 octets and reduced to a P-256 scalar in [1, n-1] (FIPS 186-5 A.2.1,
// so the bias is negligible). Every verifier holding the secret derives
// the same key; rotating the secret changes it. The key is never stored.
func DeriveGrantKey(masterSecret []byte) (*ecdsa.PrivateKey, error) {
	if len(masterSecret) < minMasterSecret {
		return nil, fmt.Errorf("offline: master secret is %d bytes, want at least %d", len(masterSecret), minMasterSecret)
	}
	okm, err := hkdf.Key(sha256.New, masterSecret, nil, grantKeyLabel, p256Size+8)
	if err != nil {
		return nil, fmt.Errorf("offline: derive grant key: %w", err)
	}
	n := elliptic.P256().Params().N
	nMinus1 := new(big.Int).Sub(n, big.NewInt(1))
	d := new(big.Int).SetBytes(okm)
	d.Mod(d, nMinus1).Add(d, big.NewInt(1))
	key, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), d.FillBytes(make([]byte, p256Size)))
	if err != nil {
		return nil, fmt.Errorf("offline: derive grant key: %w", err)
	}
	return key, nil
}

// Authorizer signs grants with the verifier's grant key.
type Authorizer struct {
	signer crypto.Signer
	public []byte // TPMT_PUBLIC
}

// NewAuthorizer takes an ECDSA P-256 signer (the grant key).
func NewAuthorizer(signer crypto.Signer) (*Authorizer, error) {
	pub, ok := signer.Public().(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, errors.New("offline: the grant key must be ECDSA P-256")
	}
	tp, err := signerTemplate(pub)
	if err != nil {
		return nil, err
	}
	return &Authorizer{signer: signer, public: tpm2.Marshal(tp)}, nil
}

// SignerPublic is the grant key's TPMT_PUBLIC, as in every grant.
func (a *Authorizer) SignerPublic() []byte { return bytes.Clone(a.public) }

// Grant signs a grant for req.
func (a *Authorizer) Grant(req GrantRequest) (*latchkeyv1.OfflineGrant, error) {
	if err := req.check(); err != nil {
		return nil, fmt.Errorf("offline: grant: %w", err)
	}
	der, err := a.signer.Sign(rand.Reader, aHash(req), crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("offline: sign grant: %w", err)
	}
	sig, err := tpmSignature(der)
	if err != nil {
		return nil, fmt.Errorf("offline: sign grant: %w", err)
	}
	pcrs := make(map[uint32][]byte, len(req.PCRs))
	for i, v := range req.PCRs {
		pcrs[i] = bytes.Clone(v)
	}
	return &latchkeyv1.OfflineGrant{
		SignerPublic: bytes.Clone(a.public),
		PolicyRef:    bytes.Clone(req.PolicyRef),
		Pcrs:         pcrs,
		ResetCount:   req.ResetCount,
		ClockMs:      req.ClockMS,
		MaxBoots:     req.MaxBoots,
		MaxHours:     req.MaxHours,
		Signature:    sig,
	}, nil
}

// eccParams is the grant key's scheme: ECDSA with SHA-256 on P-256, an
// unrestricted signing key (TPM2_VerifySignature checks the scheme).
func eccParams() *tpm2.TPMSECCParms {
	return &tpm2.TPMSECCParms{
		Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
		Scheme: tpm2.TPMTECCScheme{
			Scheme:  tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
		},
		CurveID: tpm2.TPMECCNistP256,
		KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
	}
}

// signerAttributes of the grant key's public area: a signing key that
// lives outside any TPM.
var signerAttributes = tpm2.TPMAObject{SignEncrypt: true, UserWithAuth: true}

// signerTemplate is the grant key's TPMT_PUBLIC.
func signerTemplate(pub *ecdsa.PublicKey) (tpm2.TPMTPublic, error) {
	raw, err := pub.Bytes() // 0x04 || X || Y
	if err != nil {
		return tpm2.TPMTPublic{}, fmt.Errorf("offline: grant key point: %w", err)
	}
	if len(raw) != 1+2*p256Size {
		return tpm2.TPMTPublic{}, fmt.Errorf("offline: grant key point: %d bytes, not %d", len(raw), 1+2*p256Size)
	}
	return tpm2.TPMTPublic{
		Type:             tpm2.TPMAlgECC,
		NameAlg:          tpm2.TPMAlgSHA256,
		ObjectAttributes: signerAttributes,
		Parameters:       tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, eccParams()),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: raw[1 : 1+p256Size]},
			Y: tpm2.TPM2BECCParameter{Buffer: raw[1+p256Size:]},
		}),
	}, nil
}

// parseSigner reads a grant's signer_public: exactly the encoding
// signerTemplate produces for some P-256 point, nothing else. It returns
// the public area and its TPM name.
func parseSigner(b []byte) (*tpm2.TPMTPublic, []byte, error) {
	if len(b) == 0 || len(b) > maxSignerPublic {
		return nil, nil, fmt.Errorf("signer public is %d bytes, want 1 to %d", len(b), maxSignerPublic)
	}
	pub, err := tpm2.Unmarshal[tpm2.TPMTPublic](b)
	if err != nil {
		return nil, nil, fmt.Errorf("signer public: %w", err)
	}
	point, err := pub.Unique.ECC()
	if err != nil || pub.Type != tpm2.TPMAlgECC {
		return nil, nil, errors.New("signer public is not an ECC key")
	}
	raw := append([]byte{4}, point.X.Buffer...)
	raw = append(raw, point.Y.Buffer...)
	key, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		return nil, nil, fmt.Errorf("signer public is not a P-256 point: %w", err)
	}
	want, err := signerTemplate(key)
	if err != nil {
		return nil, nil, err
	}
	if !bytes.Equal(tpm2.Marshal(want), b) {
		return nil, nil, errors.New("signer public is not an ECDSA SHA-256 P-256 signing key in canonical form")
	}
	name, err := tpm2.ObjectName(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("signer name: %w", err)
	}
	return pub, name.Buffer, nil
}

// tpmSignature converts an ASN.1 ECDSA signature into a TPMT_SIGNATURE.
func tpmSignature(der []byte) ([]byte, error) {
	var rs struct{ R, S *big.Int }
	rest, err := asn1.Unmarshal(der, &rs)
	if err != nil || len(rest) != 0 || rs.R == nil || rs.S == nil || rs.R.Sign() <= 0 || rs.S.Sign() <= 0 ||
		rs.R.BitLen() > 8*p256Size || rs.S.BitLen() > 8*p256Size {
		return nil, errors.New("malformed ECDSA signature")
	}
	return tpm2.Marshal(tpm2.TPMTSignature{
		SigAlg: tpm2.TPMAlgECDSA,
		Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgECDSA, &tpm2.TPMSSignatureECC{
			Hash:       tpm2.TPMAlgSHA256,
			SignatureR: tpm2.TPM2BECCParameter{Buffer: rs.R.FillBytes(make([]byte, p256Size))},
			SignatureS: tpm2.TPM2BECCParameter{Buffer: rs.S.FillBytes(make([]byte, p256Size))},
		}),
	}), nil
}

// parseSignature reads a grant's signature: an ECDSA SHA-256
// TPMT_SIGNATURE in canonical form.
func parseSignature(b []byte) (*tpm2.TPMTSignature, error) {
	if len(b) == 0 || len(b) > maxSignature {
		return nil, fmt.Errorf("signature is %d bytes, want 1 to %d", len(b), maxSignature)
	}
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](b)
	if err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	ecc, err := sig.Signature.ECDSA()
	if err != nil || sig.SigAlg != tpm2.TPMAlgECDSA || ecc.Hash != tpm2.TPMAlgSHA256 {
		return nil, errors.New("signature is not ECDSA with SHA-256")
	}
	if len(ecc.SignatureR.Buffer) != p256Size || len(ecc.SignatureS.Buffer) != p256Size || !bytes.Equal(tpm2.Marshal(sig), b) {
		return nil, errors.New("signature is not in canonical form")
	}
	return sig, nil
}

// checkGrant validates every field of a grant before the TPM sees it and
// returns its request, signer public area and name, and signature.
func checkGrant(g *latchkeyv1.OfflineGrant) (GrantRequest, *tpm2.TPMTPublic, []byte, *tpm2.TPMTSignature, error) {
	if g == nil {
		return GrantRequest{}, nil, nil, nil, errors.New("no grant")
	}
	req := grantRequest(g)
	if err := req.check(); err != nil {
		return GrantRequest{}, nil, nil, nil, err
	}
	pub, name, err := parseSigner(g.GetSignerPublic())
	if err != nil {
		return GrantRequest{}, nil, nil, nil, err
	}
	sig, err := parseSignature(g.GetSignature())
	if err != nil {
		return GrantRequest{}, nil, nil, nil, err
	}
	return req, pub, name, sig, nil
}
