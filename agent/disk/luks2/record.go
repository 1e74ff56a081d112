package disk

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
	recordMkfs  = "mkfs"
	recordReady = "ready"
)

type stateRecord struct {
	UUID   string `json:"uuid"`
	Seq    uint64 `json:"seq"`
	State  string `json:"state"`
	FSType string `json:"fstype"`
}

// readRecord returns the newest valid record, nil when both slots are
// blank (nothing was ever written through a mapping), or an error when a
// slot holds something that is not a record or a record of another disk.
func readRecord(d *device, uuid string) (*stateRecord, error) {
	raw, err := d.read(recordOffset, 2*recordSlotSize)
	if err != nil {
		return nil, err
	}
	var best *stateRecord
	var bad error
	for i := range 2 {
		slot := raw[i*recordSlotSize : (i+1)*recordSlotSize]
		if allZero(slot) {
			continue
		}
		rec, err := decodeRecord(slot)
		if err != nil {
			bad = fmt.Errorf("state record slot %d: %w", i, err)
			continue
		}
		if rec.UUID != uuid {
			return nil, fmt.Errorf("%w: state record belongs to disk %s, not %s", ErrVolumeContent, rec.UUID, uuid)
		}
		if best == nil || rec.Seq > best.Seq {
			best = rec
		}
	}
	if best == nil && bad != nil {
		return nil, fmt.Errorf("%w: %v", ErrVolumeContent, bad)
	}
	return best, nil
}

func decodeRecord(slot []byte) (*stateRecord, error) {
	if !bytes.Equal(slot[:len(recordMagic)], recordMagic) {
		return nil, fmt.Errorf("no record magic")
	}
	sumAt := recordSlotSize - sha256.Size
	if sum := sha256.Sum256(slot[:sumAt]); !bytes.Equal(sum[:], slot[sumAt:]) {
		return nil, fmt.Errorf("checksum mismatch")
	}
	n := int(binary.BigEndian.Uint32(slot[len(recordMagic):]))
	start := len(recordMagic) + 4
	if n <= 0 || start+n > sumAt {
		return nil, fmt.Errorf("bad length %d", n)
	}
	var rec stateRecord
	dec := json.NewDecoder(bytes.NewReader(slot[start : start+n]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return nil, err
	}
	if rec.State != recordMkfs && rec.State != recordReady {
		return nil, fmt.Errorf("unknown state %q", rec.State)
	}
	return &rec, nil
}

// writeRecord writes rec with the next sequence number into the slot the
// newer record does not occupy, and syncs.
func writeRecord(d *device, prev *stateRecord, rec stateRecord) (*stateRecord, error) {
	if prev != nil {
		rec.Seq = prev.Seq + 1
	}
	js, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	slot := make([]byte, recordSlotSize)
	copy(slot, recordMagic)
	binary.BigEndian.PutUint32(slot[len(recordMagic):], uint32(len(js)))
	copy(slot[len(recordMagic)+4:], js)
	sum := sha256.Sum256(slot[:recordSlotSize-sha256.Size])
	copy(slot[recordSlotSize-sha256.Size:], sum[:])
	off := int64(recordOffset + int(rec.Seq%2)*recordSlotSize)
	if err := d.write(slot, off); err != nil {
		return nil, err
	}
	return &rec, d.sync()
}
