package luks2

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/latchkey/latchkey/protocol"
)

// The magic bytes of the primary and the secondary header copy.
const (
	PrimaryMagic   = "LUKS\xba\xbe"
	SecondaryMagic = "SKUL\xba\xbe"
)

// ErrRejected: a LUKS2 header is present but not exactly the shape
// latchkey creates (altered or hostile); it is never unlocked.
var ErrRejected = errors.New("LUKS2 header rejected")

// Field offsets inside a LUKS2 binary header.
const (
	OffVersion   = 6
	OffHdrSize   = 8
	OffSeqID     = 16
	OffLabel     = 24
	OffCsumAlg   = 72
	OffSalt      = 104
	OffUUID      = 168
	OffSubsystem = 208
	OffHdrOffset = 256
	OffPadding   = 264
	OffCsum      = 448
	OffPadding2  = 512
)

// BinHeader is one parsed LUKS2 binary header.
type BinHeader struct {
	Version   uint16
	HdrSize   uint64
	SeqID     uint64
	Label     string
	UUID      string
	HdrOffset uint64
	// Generation is the master-secret generation the subsystem field
	// names (generation.go); set by checkBinFields.
	Generation uint32
}

// Header is a validated pair of LUKS2 headers, as read from the device.
// Its fields describe the primary copy; Prior is set only in the one
// transitional state of a rewrap cut short between its two header writes
// (agent/disk's rewrap), and describes the secondary copy, still the old
// one.
type Header struct {
	UUID       string
	SeqID      uint64
	JSON       []byte
	Generation uint32
	Area       int64 // keyslot 0's area offset: AreaA or AreaB
	Prior      *Copy
}

// Copy is one copy of a transitional header.
type Copy struct {
	SeqID      uint64
	JSON       []byte
	Generation uint32
	Area       int64
}

// ParseBinary reads the fixed fields of the binary header at b[0:4096]
// without judging them.
func ParseBinary(b []byte) BinHeader {
	return BinHeader{
		Version:   binary.BigEndian.Uint16(b[OffVersion:]),
		HdrSize:   binary.BigEndian.Uint64(b[OffHdrSize:]),
		SeqID:     binary.BigEndian.Uint64(b[OffSeqID:]),
		Label:     cString(b[OffLabel : OffLabel+48]),
		UUID:      cString(b[OffUUID : OffUUID+40]),
		HdrOffset: binary.BigEndian.Uint64(b[OffHdrOffset:]),
	}
}

// Validate checks both LUKS2 headers at the start of head (at
// least 32 KiB; the transitional state needs HeadAndKeyslot bytes) are
// exactly what latchkey writes. Each copy: its magic, version 2, the fixed
// header size and its own offset, latchkey's label, sha256 as checksum
// algorithm, a subsystem that is empty (generation 0) or latchkey-g<n>
// (n a canonical decimal from 1 to MaxKeyGeneration), a canonical UUID,
// clean padding, a valid checksum, a JSON area holding one document
// followed only by NULs, and JSON of exactly the expected shape (shape.go;
// keyslot 0's area at AreaA or AreaB). The two copies: the same UUID
// (and wantUUID, when non-empty), and either identical (seqid, JSON and
// subsystem), or in the one transitional state a rewrap leaves when cut
// short between its primary and secondary writes (checkTransition):
// anything else is refused.
func Validate(head []byte, wantUUID string) (*Header, error) {
	if len(head) < KeyslotsOffset {
		return nil, fmt.Errorf("%w: header area is %d bytes", ErrRejected, len(head))
	}
	p, pj, err := checkOneHeader(head[:HeaderSize], PrimaryMagic, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: primary header: %v", ErrRejected, err)
	}
	s, sj, err := checkOneHeader(head[SecondaryOffset:SecondaryOffset+HeaderSize], SecondaryMagic, SecondaryOffset)
	if err != nil {
		return nil, fmt.Errorf("%w: secondary header: %v", ErrRejected, err)
	}
	if p.UUID != s.UUID {
		return nil, fmt.Errorf("%w: primary and secondary headers differ", ErrRejected)
	}
	if wantUUID != "" && p.UUID != wantUUID {
		return nil, fmt.Errorf("%w: header UUID is %s, want %s", ErrRejected, p.UUID, wantUUID)
	}
	if err := checkShape(pj); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRejected, err)
	}
	pp, err := SlotParamsOf(pj)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRejected, err)
	}
	h := &Header{UUID: p.UUID, SeqID: p.SeqID, JSON: pj, Generation: p.Generation, Area: pp.AreaOffset}
	if p.SeqID == s.SeqID && p.Generation == s.Generation && bytes.Equal(pj, sj) {
		return h, nil
	}
	if tokenTransition(p, s, pj, sj) { // offline_token.go
		return h, nil
	}
	prior, err := checkTransition(head, p, pj, pp, s, sj)
	if err != nil {
		return nil, fmt.Errorf("%w: primary and secondary headers differ (%v)", ErrRejected, err)
	}
	h.Prior = prior
	return h, nil
}

// checkOneHeader validates one 16 KiB header copy and returns its JSON.
func checkOneHeader(area []byte, magic string, offset uint64) (BinHeader, []byte, error) {
	if string(area[:6]) != magic {
		return BinHeader{}, nil, fmt.Errorf("no %q magic", magic[:4])
	}
	h := ParseBinary(area)
	if err := checkBinFields(area, &h, offset); err != nil {
		return h, nil, err
	}
	if err := checkChecksum(area); err != nil {
		return h, nil, err
	}
	js, err := JSONArea(area[BinHeaderSize:])
	return h, js, err
}

func checkBinFields(area []byte, h *BinHeader, offset uint64) error {
	gen, err := ParseSubsystem(area[OffSubsystem : OffSubsystem+48])
	if err != nil {
		return err
	}
	h.Generation = gen
	switch {
	case h.Version != 2:
		return fmt.Errorf("version %d, want 2", h.Version)
	case h.HdrSize != HeaderSize:
		return fmt.Errorf("header size %d, want %d", h.HdrSize, HeaderSize)
	case h.HdrOffset != offset:
		return fmt.Errorf("header offset %d, want %d", h.HdrOffset, offset)
	case !fixedField(area[OffLabel:OffLabel+48], HeaderLabel):
		return fmt.Errorf("label %q, want %q", h.Label, HeaderLabel)
	case !fixedField(area[OffCsumAlg:OffCsumAlg+32], Hash):
		return fmt.Errorf("checksum algorithm %q, want %q", cString(area[OffCsumAlg:OffCsumAlg+32]), Hash)
	case !protocol.ValidDiskUUID(h.UUID) || !fixedField(area[OffUUID:OffUUID+40], h.UUID):
		return fmt.Errorf("malformed UUID %q", h.UUID)
	case !allZero(area[OffPadding:OffCsum]) || !allZero(area[OffPadding2:BinHeaderSize]):
		return fmt.Errorf("non-zero padding in the binary header")
	case !allZero(area[OffCsum+sha256.Size : OffPadding2]):
		return fmt.Errorf("checksum field longer than sha256")
	}
	return nil
}

// checkChecksum verifies the sha256 over the whole 16 KiB header with the
// checksum field zeroed.
func checkChecksum(area []byte) error {
	h := sha256.New()
	h.Write(area[:OffCsum])
	h.Write(make([]byte, 64))
	h.Write(area[OffPadding2:HeaderSize])
	if !bytes.Equal(h.Sum(nil), area[OffCsum:OffCsum+sha256.Size]) {
		return fmt.Errorf("checksum mismatch")
	}
	return nil
}

// JSONArea returns the JSON text of a 12 KiB JSON area: everything up to
// the first NUL (as both luks.go and cryptsetup read it), which must be
// followed by NULs only, so no second document hides behind it.
func JSONArea(area []byte) ([]byte, error) {
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
