package uefilog

import (
	"crypto"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf16"
)

// The EFI actions the firmware measures around boot attempts and
// ExitBootServices (TCG PC Client PFP, EV_EFI_ACTION), as measured: the
// ASCII string without NUL.
const (
	CallingApp          = "Calling EFI Application from Boot Option"
	ReturningApp        = "Returning from EFI Application from Boot Option"
	ExitBootServices    = "Exit Boot Services Invocation"
	ExitBootServicesOK  = "Exit Boot Services Returned with Success"
	ExitBootServicesErr = "Exit Boot Services Returned with Failure"
)

// Structure are the digests, under one hash, of the measurements that
// are firmware structure rather than a boot application: the EFI
// actions above and the separators (0x00000000, and 0xFFFFFFFF for an
// error).
type Structure struct {
	// Returning is the digest of ReturningApp, which ends a boot attempt.
	Returning string
	set       map[string]bool
}

// NewStructure computes the structural digests under h (which must be
// linked into the binary).
func NewStructure(h crypto.Hash) Structure {
	sum := func(b []byte) string {
		w := h.New()
		w.Write(b)
		return string(w.Sum(nil))
	}
	s := Structure{Returning: sum([]byte(ReturningApp)), set: map[string]bool{}}
	for _, a := range []string{CallingApp, ReturningApp, ExitBootServices, ExitBootServicesOK, ExitBootServicesErr} {
		s.set[sum([]byte(a))] = true
	}
	s.set[sum([]byte{0, 0, 0, 0})] = true
	s.set[sum([]byte{0xff, 0xff, 0xff, 0xff})] = true
	return s
}

// Is reports whether digest is a structural measurement.
func (s Structure) Is(digest []byte) bool { return s.set[string(digest)] }

// SectionName is systemd-stub's section-name measurement: the ASCII name
// with its NUL is measured (digest under h), the log carries it as
// UTF-16 (or, moved to another log, as it is). ok is false when data is
// not a name whose measurement is digest.
func SectionName(h crypto.Hash, data, digest []byte) (name string, ok bool) {
	name = strings.TrimSuffix(DecodeText(data), "\x00")
	if name == "" {
		return "", false
	}
	w := h.New()
	w.Write(append([]byte(name), 0))
	if string(w.Sum(nil)) != string(digest) {
		return "", false
	}
	return name, true
}

// Verified reports whether data is what digest (under h) measured.
func Verified(h crypto.Hash, data, digest []byte) bool {
	w := h.New()
	w.Write(data)
	return string(w.Sum(nil)) == string(digest)
}

// DecodeText reads event data that is UTF-16LE (what EFI code logs) when
// it looks like it, else bytes as they are.
func DecodeText(b []byte) string {
	if len(b) >= 2 && len(b)%2 == 0 && b[1] == 0 {
		u := make([]uint16, len(b)/2)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
		return string(utf16.Decode(u))
	}
	return string(b)
}

// ParseDigests reads "<alg>:<lower-case hex>" digests of size bytes, the
// form component policies list measurements in; field names the policy
// field in errors.
func ParseDigests(field, alg string, size int, in []string) ([][]byte, error) {
	out := make([][]byte, 0, len(in))
	for i, s := range in {
		h, ok := strings.CutPrefix(s, alg+":")
		raw, err := hex.DecodeString(h)
		if !ok || err != nil || len(raw) != size || h != strings.ToLower(h) {
			return nil, fmt.Errorf("%s[%d]: %q is not %s:<%d lower-case hex digits>", field, i, s, alg, 2*size)
		}
		out = append(out, raw)
	}
	return out, nil
}
