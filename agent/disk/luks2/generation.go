package luks2

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Master-secret generations on the disk (docs/operations.md, "Rotating
// the master secret"). The generation a disk is keyed under lives in the
// LUKS2 binary header's subsystem field, "latchkey-g<n>", empty for
// generation 0 (every header made before generations existed). The field
// is covered by the header checksum and is not part of the JSON, so the
// JSON shape stays exactly what latchkey creates.

// MaxKeyGeneration is the largest generation a header may name (the
// verifier's keys.MaxGeneration).
const MaxKeyGeneration = 1<<31 - 1

const subsystemPrefix = "latchkey-g"

// The two keyslot areas a rewrap alternates keyslot 0 between: A is
// where luksFormat puts it, B right after it, both inside the keyslots
// area luksFormat fills with random bytes.
const (
	AreaA = KeyslotsOffset
	AreaB = KeyslotsOffset + KeyslotAreaSize
)

// OtherArea is the area keyslot 0 does not use.
func OtherArea(a int64) int64 {
	if a == AreaA {
		return AreaB
	}
	return AreaA
}

// ParseSubsystem reads the generation from a 48-byte subsystem field:
// all NULs is 0; otherwise exactly "latchkey-g<n>" NUL-padded, n a
// canonical decimal from 1 to MaxKeyGeneration ("latchkey-g0" and leading
// zeros are refused: one generation, one spelling).
func ParseSubsystem(field []byte) (uint32, error) {
	if allZero(field) {
		return 0, nil
	}
	s := cString(field)
	n, err := strconv.ParseUint(s[min(len(subsystemPrefix), len(s)):], 10, 32)
	if !fixedField(field, s) || len(s) <= len(subsystemPrefix) || s[:len(subsystemPrefix)] != subsystemPrefix ||
		err != nil || n == 0 || n > MaxKeyGeneration || SubsystemName(uint32(n)) != s {
		return 0, fmt.Errorf("subsystem %q, want none or %s<generation>", s, subsystemPrefix)
	}
	return uint32(n), nil
}

// SubsystemName is the subsystem text of generation n ("" for 0).
func SubsystemName(n uint32) string {
	if n == 0 {
		return ""
	}
	return subsystemPrefix + strconv.FormatUint(uint64(n), 10)
}

// checkTransition accepts the one state in which the two header copies
// may differ: a rewrap wrote the primary copy and was cut short before
// the secondary. Both copies passed checkOneHeader and the primary passed
// checkShape; the checks here: the secondary's JSON has the exact shape
// too; the primary's seqid is the secondary's plus one; keyslot 0 sits in
// different areas (AreaA and AreaB); the generations may differ (or not:
// a rewrap toward the generation already on the disk after an operator
// moved "current" back); the JSON texts are identical except for keyslot 0's area
// offset and KDF salt; and both areas hold key material (not all zeros).
// It returns the secondary (prior) copy.
func checkTransition(head []byte, p BinHeader, pj []byte, pp SlotParams, s BinHeader, sj []byte) (*Copy, error) {
	if len(head) < HeadAndKeyslot {
		return nil, fmt.Errorf("header area is %d bytes", len(head))
	}
	if err := checkShape(sj); err != nil {
		return nil, fmt.Errorf("secondary: %v", err)
	}
	sp, err := SlotParamsOf(sj)
	if err != nil {
		return nil, err
	}
	switch {
	case p.SeqID != s.SeqID+1:
		return nil, fmt.Errorf("seqid %d and %d", p.SeqID, s.SeqID)
	case pp.AreaOffset == sp.AreaOffset:
		return nil, errors.New("both copies use the same keyslot area")
	}
	same, err := WithSlot(sj, sp, pp.AreaOffset, pp.KDFSalt)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(same, pj) {
		return nil, errors.New("metadata differs beyond keyslot 0's area and salt")
	}
	for _, a := range []int64{pp.AreaOffset, sp.AreaOffset} {
		if allZero(head[a : a+KeyslotAreaSize]) {
			return nil, fmt.Errorf("keyslot area at %d holds no key material", a)
		}
	}
	return &Copy{SeqID: s.SeqID, JSON: sj, Generation: s.Generation, Area: sp.AreaOffset}, nil
}
