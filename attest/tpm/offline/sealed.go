package offline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// The Sealed encoding: magic, version, then the fixed-size fields and the
// length-prefixed (uint16, big-endian) byte fields in a fixed order.
const (
	sealedMagic   = "LKOF"
	sealedVersion = 1
	// maxSealed bounds the whole encoding; maxBlob the public and private
	// areas (a keyedhash object sealing 128 bytes needs about 100 and 250).
	maxSealed = 2048
	maxBlob   = 768
	// signerNameSize is a SHA-256 TPM name: the algorithm ID and a digest.
	signerNameSize = 2 + 32
	// minKey and maxKey bound the sealed key (MAX_SYM_DATA is 128).
	minKey = 16
	maxKey = 128
	// nvIndexType is the top octet of every NV index handle.
	nvIndexType = 0x01
)

// sealedAttributes of the sealed object: bound to this TPM and parent,
// usable only through its policy (userWithAuth clear), and its policy
// failures never count towards dictionary-attack lockout.
var sealedAttributes = tpm2.TPMAObject{FixedTPM: true, FixedParent: true, AdminWithPolicy: true, NoDA: true}

// sealedTemplate is the public area Seal creates.
func sealedTemplate(policy []byte) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:             tpm2.TPMAlgKeyedHash,
		NameAlg:          tpm2.TPMAlgSHA256,
		ObjectAttributes: sealedAttributes,
		AuthPolicy:       tpm2.TPM2BDigest{Buffer: policy},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgKeyedHash, &tpm2.TPMSKeyedHashParms{
			Scheme: tpm2.TPMTKeyedHashScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgKeyedHash, &tpm2.TPM2BDigest{}),
	}
}

// MarshalBinary gives Sealed a versioned, size-bounded encoding; it
// refuses a Sealed that UnmarshalBinary would refuse.
func (s *Sealed) MarshalBinary() ([]byte, error) {
	if err := s.validate(); err != nil {
		return nil, fmt.Errorf("offline: encode sealed key: %w", err)
	}
	b := append([]byte(sealedMagic), sealedVersion)
	b = binary.BigEndian.AppendUint32(b, s.NVIndex)
	b = binary.BigEndian.AppendUint64(b, s.Counter)
	for _, f := range [][]byte{s.Signer, s.PolicyRef, s.Public, s.Private} {
		b = binary.BigEndian.AppendUint16(b, uint16(len(f)))
		b = append(b, f...)
	}
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary wrote and validates every
// field, the sealed object's policy included; s is unchanged on error.
func (s *Sealed) UnmarshalBinary(b []byte) error {
	dec, err := decodeSealed(b)
	if err != nil {
		return fmt.Errorf("offline: decode sealed key: %w", err)
	}
	if err := dec.validate(); err != nil {
		return fmt.Errorf("offline: decode sealed key: %w", err)
	}
	*s = *dec
	return nil
}

func decodeSealed(b []byte) (*Sealed, error) {
	if len(b) > maxSealed {
		return nil, fmt.Errorf("%d bytes, at most %d", len(b), maxSealed)
	}
	head := len(sealedMagic) + 1 + 4 + 8
	if len(b) < head || string(b[:len(sealedMagic)]) != sealedMagic {
		return nil, errors.New("not a latchkey sealed key")
	}
	if v := b[len(sealedMagic)]; v != sealedVersion {
		return nil, fmt.Errorf("version %d, want %d", v, sealedVersion)
	}
	s := &Sealed{
		NVIndex: binary.BigEndian.Uint32(b[len(sealedMagic)+1:]),
		Counter: binary.BigEndian.Uint64(b[len(sealedMagic)+5:]),
	}
	rest := b[head:]
	for _, f := range []*[]byte{&s.Signer, &s.PolicyRef, &s.Public, &s.Private} {
		if len(rest) < 2 {
			return nil, errors.New("truncated")
		}
		n := int(binary.BigEndian.Uint16(rest))
		if len(rest)-2 < n {
			return nil, errors.New("truncated")
		}
		*f = bytes.Clone(rest[2 : 2+n])
		rest = rest[2+n:]
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(rest))
	}
	return s, nil
}

// validate checks every field, and that the sealed object's policy is
// the one its fields describe: PolicyAuthorize(Signer, PolicyRef) then
// PolicyNV(NVIndex == Counter).
func (s *Sealed) validate() error {
	if s.NVIndex>>24 != nvIndexType {
		return fmt.Errorf("counter handle %#x is not an NV index", s.NVIndex)
	}
	if len(s.Signer) != signerNameSize || tpm2.TPMAlgID(binary.BigEndian.Uint16(s.Signer)) != tpm2.TPMAlgSHA256 {
		return errors.New("signer is not a SHA-256 TPM name")
	}
	if len(s.PolicyRef) == 0 || len(s.PolicyRef) > MaxPolicyRef {
		return fmt.Errorf("policy ref is %d bytes, want 1 to %d", len(s.PolicyRef), MaxPolicyRef)
	}
	pub, err := sealedPublic(s.Public)
	if err != nil {
		return err
	}
	if err := checkPrivate(s.Private); err != nil {
		return err
	}
	nvName, err := counterName(s.NVIndex)
	if err != nil {
		return err
	}
	if !bytes.Equal(pub.AuthPolicy.Buffer, sealPolicy(s.Signer, s.PolicyRef, nvName, s.Counter)) {
		return errors.New("sealed object's policy is not the one its signer, policy ref and counter describe")
	}
	return nil
}

// sealedPublic parses a TPM2B_PUBLIC that must be exactly what Seal
// creates, except for the policy digest and the TPM's unique digest.
func sealedPublic(b []byte) (*tpm2.TPMTPublic, error) {
	if len(b) == 0 || len(b) > maxBlob {
		return nil, fmt.Errorf("public area is %d bytes, want 1 to %d", len(b), maxBlob)
	}
	p2b, err := tpm2.Unmarshal[tpm2.TPM2BPublic](b)
	if err != nil {
		return nil, fmt.Errorf("public area: %w", err)
	}
	pub, err := p2b.Contents()
	if err != nil {
		return nil, fmt.Errorf("public area: %w", err)
	}
	if len(pub.AuthPolicy.Buffer) != 32 {
		return nil, errors.New("public area has no SHA-256 policy")
	}
	// The TPM fills unique with a digest binding the sealed data.
	unique, err := pub.Unique.KeyedHash()
	if err != nil || len(unique.Buffer) != 32 {
		return nil, errors.New("public area is not a keyedhash object with a SHA-256 unique digest")
	}
	want := sealedTemplate(pub.AuthPolicy.Buffer)
	want.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgKeyedHash, &tpm2.TPM2BDigest{Buffer: unique.Buffer})
	if !bytes.Equal(tpm2.Marshal(tpm2.New2B(want)), b) {
		return nil, errors.New("public area is not a policy-only sealed object of this package")
	}
	return pub, nil
}

// checkPrivate checks that b is one TPM2B_PRIVATE and nothing more.
func checkPrivate(b []byte) error {
	if len(b) < 3 || len(b) > maxBlob {
		return fmt.Errorf("private area is %d bytes, want 3 to %d", len(b), maxBlob)
	}
	if int(binary.BigEndian.Uint16(b)) != len(b)-2 {
		return errors.New("private area size does not match its length")
	}
	return nil
}
