package attest

import (
	"encoding/hex"
	"fmt"
)

// ByteSet is a set of fixed-size byte strings a policy accepts (SEV-SNP
// measurements, TDX MRTDs and RTMRs, …); nil means "not checked".
type ByteSet map[string]struct{}

// Has reports whether b is in s.
func (s ByteSet) Has(b []byte) bool {
	_, ok := s[string(b)]
	return ok
}

// HexSet decodes a policy's list of hex values of one size, named name
// in its errors; nil for an empty list.
func HexSet(list []string, size int, name string) (ByteSet, error) {
	if len(list) == 0 {
		return nil, nil
	}
	set := make(ByteSet, len(list))
	for i, s := range list {
		b, err := hex.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: not hex: %w", name, i, err)
		}
		if len(b) != size {
			return nil, fmt.Errorf("%s[%d]: %d bytes, want %d", name, i, len(b), size)
		}
		set[string(b)] = struct{}{}
	}
	return set, nil
}
