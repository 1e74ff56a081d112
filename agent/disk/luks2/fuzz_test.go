package luks2

import (
	"bytes"
	"testing"
)

// FuzzValidate: Validate never panics on any bytes a host can put in the
// two header copies, and a header it accepts re-encodes byte for byte
// (EncodeCopy of each copy's fields is the copy: no byte of an accepted
// header is left unjudged). The keyslot areas come from the seed, so the
// transitional path is reachable. Run longer with
// go test -run '^$' -fuzz FuzzValidate -fuzzminimizetime 1x ./agent/disk/luks2/
// (minimizing a 32 KiB input otherwise takes the whole run).
func FuzzValidate(f *testing.F) {
	seed := synth(f, testVolumeKey(), []byte("p"), 2)
	f.Add(bytes.Clone(seed[:KeyslotsOffset]))
	f.Add(bytes.Clone(synth(f, testVolumeKey(), []byte("p"), 0)[:KeyslotsOffset]))
	f.Add([]byte(PrimaryMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		head := bytes.Clone(seed)
		copy(head[:KeyslotsOffset], b)
		if len(b) < KeyslotsOffset {
			clear(head[len(b):KeyslotsOffset])
		}
		h, err := Validate(head, "")
		if err != nil {
			return
		}
		if got := EncodeCopy(head[:HeaderSize], h.SeqID, h.Generation, h.JSON); !bytes.Equal(got, head[:HeaderSize]) {
			t.Fatal("an accepted primary copy does not re-encode identically")
		}
		sec := Copy{SeqID: h.SeqID, JSON: h.JSON, Generation: h.Generation}
		if h.Prior != nil {
			sec = *h.Prior
		}
		if got := EncodeCopy(head[SecondaryOffset:SecondaryOffset+HeaderSize], sec.SeqID, sec.Generation, sec.JSON); !bytes.Equal(got, head[SecondaryOffset:SecondaryOffset+HeaderSize]) {
			t.Fatal("an accepted secondary copy does not re-encode identically")
		}
		if _, err := SlotParamsOf(h.JSON); err != nil {
			t.Fatalf("accepted JSON without slot parameters: %v", err)
		}
	})
}

// FuzzShape: the strict parse and the shape comparison never panic, and
// JSON of the accepted shape always yields its keyslot parameters (they
// are read by type assertion, trusting the shape check).
func FuzzShape(f *testing.F) {
	head := synth(f, testVolumeKey(), []byte("p"), 0)
	js, _ := JSONArea(head[BinHeaderSize:HeaderSize])
	f.Add(js)
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Add([]byte(`{"keyslots":{"0":[]}}`))
	f.Fuzz(func(t *testing.T, js []byte) {
		if _, err := parseStrictJSON(js); err != nil {
			return
		}
		if checkShape(js) != nil {
			return
		}
		p, err := SlotParamsOf(js)
		if err != nil || (p.AreaOffset != AreaA && p.AreaOffset != AreaB) || len(p.KDFSalt) != SaltBytes || len(p.Digest) != sha256Size {
			t.Fatalf("accepted shape, slot parameters %+v, %v", p, err)
		}
	})
}

// FuzzRecord: NewestRecord never panics, and a record it returns encodes
// to a slot it decodes to the same record.
func FuzzRecord(f *testing.F) {
	slot, _, _ := EncodeRecord(Record{UUID: testUUID, State: RecordReady, FSType: "xfs"})
	f.Add(slot)
	f.Fuzz(func(t *testing.T, b []byte) {
		raw := make([]byte, 2*RecordSlotSize)
		copy(raw, b)
		rec, err := NewestRecord(raw, testUUID)
		if err != nil || rec == nil {
			return
		}
		again, off, err := EncodeRecord(*rec)
		if err != nil {
			t.Fatal(err)
		}
		clear(raw)
		copy(raw[off-RecordOffset:], again)
		if got, err := NewestRecord(raw, testUUID); err != nil || *got != *rec {
			t.Fatalf("re-encoded record %+v, %v; want %+v", got, err, rec)
		}
	})
}
