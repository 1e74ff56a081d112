package luks2

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// The state record is latchkey's note of how far the file system inside
// the volume got. It lives in the gap between the keyslots area and the
// data segment, outside the encrypted volume and outside anything
// cryptsetup manages, and exists so a crash during mkfs can be told apart
// from a file system that was complete and later damaged: the first is
// finished by running mkfs again, the second is never formatted.
//
// Two 4 KiB slots take turns (sequence number parity), so a torn write of
// one leaves the other. Each slot is: magic (16 bytes), a big-endian
// length, the JSON record, zero padding, and a sha256 of everything before
// it in the last 32 bytes. The record is not secret and not authenticated:
// a host that rewrites it can make the agent refuse the disk or remake the
// file system, which it could do anyway by overwriting the disk; it can
// never make the agent write plaintext or use a key the host knows.

var recordMagic = []byte("LATCHKEY-STATE\x00\x01")

// Record states.
const (
	RecordMkfs  = "mkfs"
	RecordReady = "ready"
)

// Record is the state record: how far the file system inside the volume
// with this UUID got.
type Record struct {
	UUID   string `json:"uuid"`
	Seq    uint64 `json:"seq"`
	State  string `json:"state"`
	FSType string `json:"fstype"`
}

// NewestRecord returns the newest valid record in raw, both slots as read
// from RecordOffset (2*RecordSlotSize bytes): nil when both slots are
// blank (nothing was ever written through a mapping), or an error when a
// slot holds something that is not a record or a record of another disk.
func NewestRecord(raw []byte, uuid string) (*Record, error) {
	if len(raw) != 2*RecordSlotSize {
		return nil, fmt.Errorf("state record area is %d bytes, want %d", len(raw), 2*RecordSlotSize)
	}
	var best *Record
	var bad error
	for i := range 2 {
		slot := raw[i*RecordSlotSize : (i+1)*RecordSlotSize]
		if allZero(slot) {
			continue
		}
		rec, err := decodeRecord(slot)
		if err != nil {
			bad = fmt.Errorf("state record slot %d: %w", i, err)
			continue
		}
		if rec.UUID != uuid {
			return nil, fmt.Errorf("state record belongs to disk %s, not %s", rec.UUID, uuid)
		}
		if best == nil || rec.Seq > best.Seq {
			best = rec
		}
	}
	if best == nil && bad != nil {
		return nil, bad
	}
	return best, nil
}

func decodeRecord(slot []byte) (*Record, error) {
	if !bytes.Equal(slot[:len(recordMagic)], recordMagic) {
		return nil, fmt.Errorf("no record magic")
	}
	sumAt := RecordSlotSize - sha256.Size
	if sum := sha256.Sum256(slot[:sumAt]); !bytes.Equal(sum[:], slot[sumAt:]) {
		return nil, fmt.Errorf("checksum mismatch")
	}
	n := int(binary.BigEndian.Uint32(slot[len(recordMagic):]))
	start := len(recordMagic) + 4
	if n <= 0 || start+n > sumAt {
		return nil, fmt.Errorf("bad length %d", n)
	}
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(slot[start : start+n]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return nil, err
	}
	if rec.State != RecordMkfs && rec.State != RecordReady {
		return nil, fmt.Errorf("unknown state %q", rec.State)
	}
	return &rec, nil
}

// EncodeRecord returns rec as one slot and the device offset of the slot
// its sequence number selects (the slot the newer record does not
// occupy, when rec.Seq is the newer one's plus one).
func EncodeRecord(rec Record) ([]byte, int64, error) {
	js, err := json.Marshal(rec)
	if err != nil {
		return nil, 0, err
	}
	start := len(recordMagic) + 4
	if start+len(js) > RecordSlotSize-sha256.Size {
		return nil, 0, fmt.Errorf("state record is %d bytes, over its slot", len(js))
	}
	slot := make([]byte, RecordSlotSize)
	copy(slot, recordMagic)
	binary.BigEndian.PutUint32(slot[len(recordMagic):], uint32(len(js)))
	copy(slot[start:], js)
	sum := sha256.Sum256(slot[:RecordSlotSize-sha256.Size])
	copy(slot[RecordSlotSize-sha256.Size:], sum[:])
	return slot, int64(RecordOffset + int(rec.Seq%2)*RecordSlotSize), nil
}
