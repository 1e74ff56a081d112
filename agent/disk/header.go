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
	// generation is the master-secret generation the subsystem field
	// names (generation.go); set by checkBinFields.
	generation uint32
}

// header is a validated pair of LUKS2 headers, as read from the device.
// Its fields describe the primary copy; prior is set only in the one
// transitional state of a rewrap cut short between its two header writes
// (rewrap.go), and describes the secondary copy, still the old one.
type header struct {
	uuid       string
	seqID      uint64
	json       []byte
	generation uint32
	area       int64 // keyslot 0's area offset: areaA or areaB
	prior      *headerCopy
}

// headerCopy is one copy of a transitional header.
type headerCopy struct {
	seqID      uint64
	json       []byte
	generation uint32
	area       int64
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

// validateHeader checks both LUKS2 headers at the start of head (at
// least 32 KiB; the transitional state needs headAndKeyslot bytes) are
// exactly what latchkey writes. Each copy: its magic, version 2, the fixed
// header size and its own offset, latchkey's label, sha256 as checksum
// algorithm, a subsystem that is empty (generation 0) or latchkey-g<n>
// (n a canonical decimal from 1 to MaxKeyGeneration), a canonical UUID,
// clean padding, a valid checksum, a JSON area holding one document
// followed only by NULs, and JSON of exactly the expected shape (shape.go;
// keyslot 0's area at areaA or areaB). The two copies: the same UUID
// (and wantUUID, when non-empty), and either identical (seqid, JSON and
// subsystem), or in the one transitional state a rewrap leaves when cut
// short between its primary and secondary writes (checkTransition):
// anything else is refused.
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
	if p.uuid != s.uuid {
		return nil, fmt.Errorf("%w: primary and secondary headers differ", ErrHeaderRejected)
	}
	if wantUUID != "" && p.uuid != wantUUID {
		return nil, fmt.Errorf("%w: header UUID is %s, want %s", ErrHeaderRejected, p.uuid, wantUUID)
	}
	if err := checkShape(pj); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrHeaderRejected, err)
	}
	pp, err := slotParamsOf(pj)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrHeaderRejected, err)
	}
	h := &header{uuid: p.uuid, seqID: p.seqID, json: pj, generation: p.generation, area: pp.areaOffset}
	if p.seqID == s.seqID && p.generation == s.generation && bytes.Equal(pj, sj) {
		return h, nil
	}
	if tokenTransition(p, s, pj, sj) { // offline_token.go
		return h, nil
	}
	prior, err := checkTransition(head, p, pj, pp, s, sj)
	if err != nil {
		return nil, fmt.Errorf("%w: primary and secondary headers differ (%v)", ErrHeaderRejected, err)
	}
	h.prior = prior
	return h, nil
}

// checkOneHeader validates one 16 KiB header copy and returns its JSON.
func checkOneHeader(area []byte, magic []byte, offset uint64) (binHeader, []byte, error) {
	if !bytes.Equal(area[:6], magic) {
		return binHeader{}, nil, fmt.Errorf("no %q magic", magic[:4])
	}
	h := parseBinHeader(area)
	if err := checkBinFields(area, &h, offset); err != nil {
		return h, nil, err
	}
	if err := checkChecksum(area); err != nil {
		return h, nil, err
	}
	js, err := jsonArea(area[binHeaderSize:])
	return h, js, err
}

func checkBinFields(area []byte, h *binHeader, offset uint64) error {
	gen, err := parseSubsystem(area[offSubsystem : offSubsystem+48])
	if err != nil {
		return err
	}
	h.generation = gen
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
