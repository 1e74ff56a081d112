package disk

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
	areaA = keyslotsOffset
	areaB = keyslotsOffset + keyslotAreaSize
)

// otherArea is the area keyslot 0 does not use.
func otherArea(a int64) int64 {
	if a == areaA {
		return areaB
	}
	return areaA
}

// parseSubsystem reads the generation from a 48-byte subsystem field:
// all NULs is 0; otherwise exactly "latchkey-g<n>" NUL-padded, n a
// canonical decimal from 1 to MaxKeyGeneration ("latchkey-g0" and leading
// zeros are refused: one generation, one spelling).
func parseSubsystem(field []byte) (uint32, error) {
	if allZero(field) {
		return 0, nil
	}
	s := cString(field)
	n, err := strconv.ParseUint(s[min(len(subsystemPrefix), len(s)):], 10, 32)
	if !fixedField(field, s) || len(s) <= len(subsystemPrefix) || s[:len(subsystemPrefix)] != subsystemPrefix ||
		err != nil || n == 0 || n > MaxKeyGeneration || subsystemName(uint32(n)) != s {
		return 0, fmt.Errorf("subsystem %q, want none or %s<generation>", s, subsystemPrefix)
	}
	return uint32(n), nil
}

// subsystemName is the subsystem text of generation n ("" for 0).
func subsystemName(n uint32) string {
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
// different areas (areaA and areaB); the generations may differ (or not:
// a rewrap toward the generation already on the disk after an operator
// moved "current" back); the JSON texts are identical except for keyslot 0's area
// offset and KDF salt; and both areas hold key material (not all zeros).
// It returns the secondary (prior) copy.
func checkTransition(head []byte, p binHeader, pj []byte, pp slotParams, s binHeader, sj []byte) (*headerCopy, error) {
	if len(head) < headAndKeyslot {
		return nil, fmt.Errorf("header area is %d bytes", len(head))
	}
	if err := checkShape(sj); err != nil {
		return nil, fmt.Errorf("secondary: %v", err)
	}
	sp, err := slotParamsOf(sj)
	if err != nil {
		return nil, err
	}
	switch {
	case p.seqID != s.seqID+1:
		return nil, fmt.Errorf("seqid %d and %d", p.seqID, s.seqID)
	case pp.areaOffset == sp.areaOffset:
		return nil, errors.New("both copies use the same keyslot area")
	}
	same, err := withSlot(sj, sp, pp.areaOffset, pp.kdfSalt)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(same, pj) {
		return nil, errors.New("metadata differs beyond keyslot 0's area and salt")
	}
	for _, a := range []int64{pp.areaOffset, sp.areaOffset} {
		if allZero(head[a : a+keyslotAreaSize]) {
			return nil, fmt.Errorf("keyslot area at %d holds no key material", a)
		}
	}
	return &headerCopy{seqID: s.seqID, json: sj, generation: s.generation, area: sp.areaOffset}, nil
}
