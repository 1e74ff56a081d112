package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/latchkey/latchkey/protocol"
)

var (
	primaryMagic   = []byte("LUKS\xba\xbe")
	secondaryMagic = []byte("SKUL\xba\xbe")
)

// Field offsets inside a LUKS2 binary header.
const (
	offVersion   = 6
	offHdrSize   = 8
	offSeqID     = 16
	offLabel     = 24
	offCsumAlg   = 72
	offSalt      = 104
	offUUID      = 168
	offSubsystem = 208
	offHdrOffset = 256
	offPadding   = 264
	offCsum      = 448
	offPadding2  = 512
)

// binHeader is one parsed LUKS2 binary header.
type binHeader struct {
	version   uint16
	hdrSize   uint64
	seqID     uint64
	label     string
	uuid      string
	hdrOffset uint64
}

// header is a validated pair of LUKS2 headers, as read from the device.
type header struct {
	uuid  string
	seqID uint64
	json  []byte
}

// parseBinHeader reads the fixed fields of the binary header at b[0:4096]
// without judging them.
func parseBinHeader(b []byte) binHeader {
	return binHeader{
		version:   binary.BigEndian.Uint16(b[offVersion:]),
		hdrSize:   binary.BigEndian.Uint64(b[offHdrSize:]),
		seqID:     binary.BigEndian.Uint64(b[offSeqID:]),
		label:     cString(b[offLabel : offLabel+48]),
		uuid:      cString(b[offUUID : offUUID+40]),
		hdrOffset: binary.BigEndian.Uint64(b[offHdrOffset:]),
	}
}

// validateHeader checks both LUKS2 headers at the start of head (at least
// 32 KiB) are exactly what latchkey's luksFormat writes: fixed sizes,
// label, checksum algorithm, clean padding, a valid checksum, identical
// metadata in both copies, and JSON of exactly the expected shape. A
// non-empty wantUUID must match too.
func validateHeader(head []byte, wantUUID string) (*header, error) {
	if len(head) < keyslotsOffset {
		return nil, fmt.Errorf("%w: header area is %d bytes", ErrHeaderRejected, len(head))
	}
	p, pj, err := checkOneHeader(head[:hdrSize], primaryMagic, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: primary header: %v", ErrHeaderRejected, err)
	}
	s, sj, err := checkOneHeader(head[secondaryOffset:secondaryOffset+hdrSize], secondaryMagic, secondaryOffset)
	if err != nil {
		return nil, fmt.Errorf("%w: secondary header: %v", ErrHeaderRejected, err)
	}
	if p.seqID != s.seqID || p.uuid != s.uuid || !bytes.Equal(pj, sj) {
		return nil, fmt.Errorf("%w: primary and secondary headers differ", ErrHeaderRejected)
	}
	if wantUUID != "" && p.uuid != wantUUID {
		return nil, fmt.Errorf("%w: header UUID is %s, want %s", ErrHeaderRejected, p.uuid, wantUUID)
	}
	if err := checkShape(pj); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrHeaderRejected, err)
	}
	return &header{uuid: p.uuid, seqID: p.seqID, json: pj}, nil
}

// checkOneHeader validates one 16 KiB header copy and returns its JSON.
func checkOneHeader(area []byte, magic []byte, offset uint64) (binHeader, []byte, error) {
	if !bytes.Equal(area[:6], magic) {
		return binHeader{}, nil, fmt.Errorf("no %q magic", magic[:4])
	}
	h := parseBinHeader(area)
	if err := checkBinFields(area, h, offset); err != nil {
		return h, nil, err
	}
	if err := checkChecksum(area); err != nil {
		return h, nil, err
	}
	js, err := jsonArea(area[binHeaderSize:])
	return h, js, err
}

func checkBinFields(area []byte, h binHeader, offset uint64) error {
	switch {
	case h.version != 2:
		return fmt.Errorf("version %d, want 2", h.version)
	case h.hdrSize != hdrSize:
		return fmt.Errorf("header size %d, want %d", h.hdrSize, hdrSize)
	case h.hdrOffset != offset:
		return fmt.Errorf("header offset %d, want %d", h.hdrOffset, offset)
	case !fixedField(area[offLabel:offLabel+48], HeaderLabel):
		return fmt.Errorf("label %q, want %q", h.label, HeaderLabel)
	case !fixedField(area[offCsumAlg:offCsumAlg+32], luksHash):
		return fmt.Errorf("checksum algorithm %q, want %q", cString(area[offCsumAlg:offCsumAlg+32]), luksHash)
	case !fixedField(area[offSubsystem:offSubsystem+48], ""):
		return fmt.Errorf("subsystem %q, want none", cString(area[offSubsystem:offSubsystem+48]))
	case !protocol.ValidDiskUUID(h.uuid) || !fixedField(area[offUUID:offUUID+40], h.uuid):
		return fmt.Errorf("malformed UUID %q", h.uuid)
	case !allZero(area[offPadding:offCsum]) || !allZero(area[offPadding2:binHeaderSize]):
		return fmt.Errorf("non-zero padding in the binary header")
	case !allZero(area[offCsum+sha256.Size : offPadding2]):
		return fmt.Errorf("checksum field longer than sha256")
	}
	return nil
}

// checkChecksum verifies the sha256 over the whole 16 KiB header with the
// checksum field zeroed.
func checkChecksum(area []byte) error {
	h := sha256.New()
	h.Write(area[:offCsum])
	h.Write(make([]byte, 64))
	h.Write(area[offPadding2:hdrSize])
	if !bytes.Equal(h.Sum(nil), area[offCsum:offCsum+sha256.Size]) {
		return fmt.Errorf("checksum mismatch")
	}
	return nil
}

// jsonArea returns the JSON text of a 12 KiB JSON area: everything up to
// the first NUL (as both luks.go and cryptsetup read it), which must be
// followed by NULs only, so no second document hides behind it.
func jsonArea(area []byte) ([]byte, error) {
	end := bytes.IndexByte(area, 0)
	if end <= 0 {
		return nil, fmt.Errorf("JSON area is empty or unterminated")
	}
	if !allZero(area[end:]) {
		return nil, fmt.Errorf("data after the JSON metadata")
	}
	return area[:end], nil
}

// fixedField reports whether a NUL-padded field holds exactly s.
func fixedField(b []byte, s string) bool {
	return len(s) < len(b) && string(b[:len(s)]) == s && allZero(b[len(s):])
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// firstNonZero returns the offset of the first non-zero byte, or -1.
func firstNonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
}
