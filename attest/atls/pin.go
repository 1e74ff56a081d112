package atls

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strings"
)

// Pin is the SHA-256 of a certificate's DER SubjectPublicKeyInfo, written
// "sha256:<64 hex digits>" (the form kubeadm uses for CA cert hashes).
type Pin [sha256.Size]byte

// PinOf returns the SPKI pin of cert.
func PinOf(cert *x509.Certificate) Pin {
	return sha256.Sum256(cert.RawSubjectPublicKeyInfo)
}

// ParsePin parses "sha256:<hex>".
func ParsePin(s string) (Pin, error) {
	var p Pin
	hexPart, ok := strings.CutPrefix(strings.TrimSpace(s), "sha256:")
	if !ok {
		return p, fmt.Errorf("pin %q: want sha256:<64 hex digits>", s)
	}
	raw, err := hex.DecodeString(hexPart)
	if err != nil || len(raw) != sha256.Size {
		return p, fmt.Errorf("pin %q: want sha256:<64 hex digits>", s)
	}
	copy(p[:], raw)
	return p, nil
}

// ParsePins parses a list of pins, refusing an empty list entry.
func ParsePins(ss []string) ([]Pin, error) {
	pins := make([]Pin, 0, len(ss))
	for _, s := range ss {
		p, err := ParsePin(s)
		if err != nil {
			return nil, err
		}
		pins = append(pins, p)
	}
	return pins, nil
}

func (p Pin) String() string { return "sha256:" + hex.EncodeToString(p[:]) }

// Equal compares in constant time.
func (p Pin) Equal(q Pin) bool { return subtle.ConstantTimeCompare(p[:], q[:]) == 1 }
