package luks2

import (
	"bytes"
	"crypto/aes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"

	"golang.org/x/crypto/pbkdf2"
	"golang.org/x/crypto/xts"
)

// LUKS2 keyslot cryptography for the rewrap (agent/disk's rewrap.go), limited to the
// one keyslot shape the validator accepts: pbkdf2-sha256 at
// KDFIterations, luks1 anti-forensic split with sha256 over AFStripes
// stripes, area encrypted with aes-xts-plain64 in 512-byte sectors whose
// IV is the sector number within the area. luks.go cannot hand out a
// volume key (it keeps it unexported), and the rewrap must re-encrypt it
// in memory, so the two directions are written here; every image they
// produce is unsealed again with luks.go before it reaches the disk, and
// the tests open the result with cryptsetup.

const (
	keyslotSector   = 512
	afMaterialBytes = VolumeKeyBytes * AFStripes // 256000, a multiple of 512
)

// ErrWrongKey: the passphrase does not unseal the keyslot (the digest
// does not match).
var ErrWrongKey = errors.New("the key does not open this keyslot")

// SlotParams are the per-header values of keyslot 0 and digest 0.
type SlotParams struct {
	AreaOffset int64
	KDFSalt    []byte
	DigestSalt []byte
	Digest     []byte
}

// UnwrapVolumeKey derives the area key from passphrase, decrypts the
// keyslot area, merges the stripes and checks the result against the
// digest. The caller clears the returned key.
func UnwrapVolumeKey(area []byte, passphrase []byte, p SlotParams) ([]byte, error) {
	if len(area) < afMaterialBytes {
		return nil, fmt.Errorf("keyslot area is %d bytes, want %d", len(area), afMaterialBytes)
	}
	c, err := areaCipher(passphrase, p.KDFSalt)
	if err != nil {
		return nil, err
	}
	material := make([]byte, afMaterialBytes)
	defer clear(material)
	for i := 0; i < afMaterialBytes/keyslotSector; i++ {
		off := i * keyslotSector
		c.Decrypt(material[off:off+keyslotSector], area[off:off+keyslotSector], uint64(i))
	}
	vk := afMerge(material)
	if !digestMatches(vk, p) {
		clear(vk)
		return nil, ErrWrongKey
	}
	return vk, nil
}

// WrapVolumeKey is the inverse: a full keyslot area (KeyslotAreaSize
// bytes) holding vk split over AFStripes random stripes and encrypted
// under passphrase with salt. The bytes past the key material are random,
// as cryptsetup leaves them.
func WrapVolumeKey(vk, passphrase, salt []byte) ([]byte, error) {
	c, err := areaCipher(passphrase, salt)
	if err != nil {
		return nil, err
	}
	material := afSplit(vk)
	defer clear(material)
	area := make([]byte, KeyslotAreaSize)
	rand.Read(area[afMaterialBytes:])
	for i := 0; i < afMaterialBytes/keyslotSector; i++ {
		off := i * keyslotSector
		c.Encrypt(area[off:off+keyslotSector], material[off:off+keyslotSector], uint64(i))
	}
	return area, nil
}

func areaCipher(passphrase, salt []byte) (*xts.Cipher, error) {
	k := pbkdf2.Key(passphrase, salt, KDFIterations, VolumeKeyBytes, sha256.New)
	defer clear(k)
	c, err := xts.NewCipher(aes.NewCipher, k)
	if err != nil {
		return nil, fmt.Errorf("keyslot cipher: %w", err)
	}
	return c, nil
}

func digestMatches(vk []byte, p SlotParams) bool {
	d := pbkdf2.Key(vk, p.DigestSalt, KDFIterations, len(p.Digest), sha256.New)
	defer clear(d)
	return len(p.Digest) > 0 && subtle.ConstantTimeCompare(d, p.Digest) == 1
}

// afSplit is LUKS's anti-forensic split with sha256: AFStripes-1 random
// stripes, the last one the key XOR the diffused fold of the others.
func afSplit(vk []byte) []byte {
	out := make([]byte, afMaterialBytes)
	n := len(vk)
	rand.Read(out[:n*(AFStripes-1)])
	buf := make([]byte, n)
	defer clear(buf)
	h := sha256.New()
	for i := 0; i < AFStripes-1; i++ {
		xorInto(buf, out[i*n:(i+1)*n])
		diffuse(buf, h)
	}
	last := out[(AFStripes-1)*n:]
	for i := range last {
		last[i] = vk[i] ^ buf[i]
	}
	return out
}

// afMerge undoes afSplit.
func afMerge(material []byte) []byte {
	n := VolumeKeyBytes
	buf := make([]byte, n)
	h := sha256.New()
	for i := 0; i < AFStripes-1; i++ {
		xorInto(buf, material[i*n:(i+1)*n])
		diffuse(buf, h)
	}
	xorInto(buf, material[(AFStripes-1)*n:AFStripes*n])
	return buf
}

func xorInto(dst, src []byte) {
	for i := range dst {
		dst[i] ^= src[i]
	}
}

// diffuse replaces each hash-sized block of b (the last may be shorter)
// by H(be32(index) || block), in place.
func diffuse(b []byte, h hash.Hash) {
	var idx [4]byte
	var sum [sha256.Size]byte
	size := h.Size()
	for i := 0; i*size < len(b); i++ {
		end := min((i+1)*size, len(b))
		binary.BigEndian.PutUint32(idx[:], uint32(i))
		h.Reset()
		h.Write(idx[:])
		h.Write(b[i*size : end])
		copy(b[i*size:end], h.Sum(sum[:0]))
	}
}

// SlotParamsOf reads keyslot 0's and digest 0's values from JSON the
// validator accepted (checkShape), so every field is present and well
// formed.
func SlotParamsOf(js []byte) (SlotParams, error) {
	tree, err := parseStrictJSON(js)
	if err != nil {
		return SlotParams{}, err
	}
	root := tree.(map[string]any)
	ks := root["keyslots"].(map[string]any)["0"].(map[string]any)
	dg := root["digests"].(map[string]any)["0"].(map[string]any)
	var p SlotParams
	var offset int64
	if _, err := fmt.Sscan(ks["area"].(map[string]any)["offset"].(string), &offset); err != nil {
		return SlotParams{}, fmt.Errorf("keyslot area offset: %w", err)
	}
	p.AreaOffset = offset
	for _, f := range []struct {
		dst *[]byte
		v   any
	}{
		{&p.KDFSalt, ks["kdf"].(map[string]any)["salt"]},
		{&p.DigestSalt, dg["salt"]},
		{&p.Digest, dg["digest"]},
	} {
		b, err := base64.StdEncoding.Strict().DecodeString(f.v.(string))
		if err != nil {
			return SlotParams{}, err
		}
		*f.dst = b
	}
	return p, nil
}

// WithSlot returns js with keyslot 0's area offset and KDF salt replaced,
// as text, so everything else stays byte for byte what cryptsetup wrote.
// Each replaced value must occur exactly once.
func WithSlot(js []byte, old SlotParams, newOffset int64, newSalt []byte) ([]byte, error) {
	out := js
	for _, r := range []struct{ from, to string }{
		{fmt.Sprintf(`"area":{"type":"raw","offset":"%d"`, old.AreaOffset), fmt.Sprintf(`"area":{"type":"raw","offset":"%d"`, newOffset)},
		{`"salt":"` + base64.StdEncoding.EncodeToString(old.KDFSalt) + `"`, `"salt":"` + base64.StdEncoding.EncodeToString(newSalt) + `"`},
	} {
		if n := bytes.Count(out, []byte(r.from)); n != 1 {
			return nil, fmt.Errorf("header JSON holds %q %d times, want once", r.from, n)
		}
		out = bytes.Replace(out, []byte(r.from), []byte(r.to), 1)
	}
	if len(out) >= JSONAreaSize {
		return nil, fmt.Errorf("rewrapped JSON is %d bytes, over the %d-byte area", len(out), JSONAreaSize)
	}
	return out, nil
}
