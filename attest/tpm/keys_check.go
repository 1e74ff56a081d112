package tpm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest/atls"
)

// p256CoordSize is the byte length of a P-256 coordinate.
const p256CoordSize = 32

// checkAK refuses an AK that is not a TPM-bound restricted ECDSA P-256
// signing key. restricted is what makes a quote trustworthy: a restricted
// key signs only digests the TPM computed over structures it produced
// (TPM_GENERATED_VALUE), so nobody can get it to sign a forged quote.
// fixedTPM, fixedParent and sensitiveDataOrigin say the private key was
// made in this TPM and can never leave it.
func checkAK(pub *tpm2.TPMTPublic) error {
	a := pub.ObjectAttributes
	switch {
	case pub.Type != tpm2.TPMAlgECC:
		return errors.New("ak is not an ecc key")
	case pub.NameAlg != tpm2.TPMAlgSHA256:
		return errors.New("ak name algorithm is not sha-256")
	case !a.Restricted:
		return errors.New("ak is not restricted")
	case !a.SignEncrypt || a.Decrypt:
		return errors.New("ak is not a signing-only key")
	case !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin:
		return errors.New("ak is not bound to its tpm (fixedTPM, fixedParent, sensitiveDataOrigin)")
	}
	params, err := pub.Parameters.ECCDetail()
	if err != nil {
		return fmt.Errorf("ak parameters: %w", err)
	}
	if params.CurveID != tpm2.TPMECCNistP256 {
		return errors.New("ak curve is not nist p-256")
	}
	return nil
}

// akKey converts the AK public area into an ECDSA key, refusing a point
// that is not on P-256.
func akKey(pub *tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	point, err := pub.Unique.ECC()
	if err != nil {
		return nil, fmt.Errorf("ak point: %w", err)
	}
	x, y := point.X.Buffer, point.Y.Buffer
	if len(x) > p256CoordSize || len(y) > p256CoordSize {
		return nil, errors.New("ak point coordinates too long")
	}
	raw := make([]byte, 1+2*p256CoordSize)
	raw[0] = 4 // uncompressed point
	copy(raw[1+p256CoordSize-len(x):], x)
	copy(raw[1+2*p256CoordSize-len(y):], y)
	k, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		return nil, fmt.Errorf("ak point: %w", err)
	}
	return k, nil
}

// checkEK refuses an EK public area that is not an RSA-2048 restricted
// decryption key bound to its TPM, the shape of the TCG default EK whose
// certificate the TPM carries and the kind of key credential activation
// needs.
func checkEK(pub *tpm2.TPMTPublic) error {
	a := pub.ObjectAttributes
	switch {
	case pub.Type != tpm2.TPMAlgRSA:
		return errors.New("ek is not an rsa key")
	case pub.NameAlg != tpm2.TPMAlgSHA256:
		return errors.New("ek name algorithm is not sha-256")
	case !a.Restricted || !a.Decrypt || a.SignEncrypt:
		return errors.New("ek is not a restricted decryption key")
	case !a.FixedTPM || !a.FixedParent:
		return errors.New("ek is not bound to its tpm")
	}
	params, err := pub.Parameters.RSADetail()
	if err != nil {
		return fmt.Errorf("ek parameters: %w", err)
	}
	if params.KeyBits != 2048 {
		return fmt.Errorf("ek has %d bits, want 2048", params.KeyBits)
	}
	return nil
}

// ekKey converts the EK public area into an RSA key.
func ekKey(pub *tpm2.TPMTPublic) (*rsa.PublicKey, error) {
	params, err := pub.Parameters.RSADetail()
	if err != nil {
		return nil, fmt.Errorf("ek parameters: %w", err)
	}
	n, err := pub.Unique.RSA()
	if err != nil {
		return nil, fmt.Errorf("ek modulus: %w", err)
	}
	if len(n.Buffer) != 2048/8 || n.Buffer[0] == 0 {
		return nil, errors.New("ek modulus is not 2048 bits")
	}
	if params.Exponent != 0 && params.Exponent != 65537 {
		return nil, fmt.Errorf("ek exponent %d is not 65537", params.Exponent)
	}
	return tpm2.RSAPub(params, n)
}

// keyHash is the "sha256:<hex>" SPKI hash policies pin keys by: it names
// the key alone, independent of TPM attributes or certificate.
func keyHash(k any) (atls.Pin, error) {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return atls.Pin{}, fmt.Errorf("marshal public key: %w", err)
	}
	return sha256.Sum256(der), nil
}

// objectName is the TPM Name of an object: its name algorithm followed by
// the digest of its public area exactly as the TPM marshals it. raw must
// be canonical (see parseCanonical) for the TPM to compute the same name.
func objectName(raw []byte) []byte {
	digest := sha256.Sum256(raw)
	return append(binary.BigEndian.AppendUint16(nil, uint16(tpm2.TPMAlgSHA256)), digest[:]...)
}
