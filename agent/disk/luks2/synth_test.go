package luks2

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/crypto/pbkdf2"
)

const testUUID = "2b1e0c38-6a55-4d7e-9a1d-1e7a0f1c2b3d"

// synth builds, in memory and without cryptsetup, a header of exactly
// the shape latchkey's luksFormat writes (agent/disk's tests check the
// real luksFormat output against Validate): both copies, keyslot 0 in
// area A holding vk under passphrase, area B zero. Salts are fixed, so
// the result depends only on the arguments.
func synth(t testing.TB, vk, passphrase []byte, gen uint32) []byte {
	t.Helper()
	kdfSalt := bytes.Repeat([]byte{0x5a}, SaltBytes)
	digestSalt := bytes.Repeat([]byte{0xa5}, SaltBytes)
	digest := pbkdf2.Key(vk, digestSalt, KDFIterations, sha256Size, sha256.New)
	b64 := base64.StdEncoding.EncodeToString
	js := fmt.Sprintf(`{"keyslots":{"0":{"type":"luks2","key_size":%d,"af":{"type":"luks1","stripes":%d,"hash":"sha256"},`+
		`"area":{"type":"raw","offset":"%d","size":"%d","encryption":"aes-xts-plain64","key_size":%d},`+
		`"kdf":{"type":"pbkdf2","hash":"sha256","iterations":%d,"salt":"%s"}}},"tokens":{},`+
		`"segments":{"0":{"type":"crypt","offset":"%d","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":%d}},`+
		`"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":%d,"salt":"%s","digest":"%s"}},`+
		`"config":{"json_size":"%d","keyslots_size":"%d"}}`,
		VolumeKeyBytes, AFStripes, AreaA, KeyslotAreaSize, VolumeKeyBytes, KDFIterations, b64(kdfSalt),
		DataOffset, SectorSize, KDFIterations, b64(digestSalt), b64(digest), JSONAreaSize, KeyslotsSize)
	head := make([]byte, HeadAndKeyslot)
	for _, c := range []struct {
		off   int
		magic string
	}{{0, PrimaryMagic}, {SecondaryOffset, SecondaryMagic}} {
		b := head[c.off : c.off+HeaderSize]
		copy(b, c.magic)
		binary.BigEndian.PutUint16(b[OffVersion:], 2)
		binary.BigEndian.PutUint64(b[OffHdrSize:], HeaderSize)
		binary.BigEndian.PutUint64(b[OffSeqID:], 1)
		copy(b[OffLabel:], HeaderLabel)
		copy(b[OffCsumAlg:], Hash)
		copy(b[OffSalt:], bytes.Repeat([]byte{byte(c.off>>8) | 1}, 64))
		copy(b[OffUUID:], testUUID)
		binary.BigEndian.PutUint64(b[OffHdrOffset:], uint64(c.off))
		copy(b[BinHeaderSize:], js)
		SetChecksum(b)
	}
	StampGeneration(head, gen)
	area, err := WrapVolumeKey(vk, passphrase, kdfSalt)
	if err != nil {
		t.Fatal(err)
	}
	copy(head[AreaA:], area)
	return head
}

func testVolumeKey() []byte { return bytes.Repeat([]byte{7}, VolumeKeyBytes) }

// The synthetic header is accepted, names its generation, and its
// keyslot opens with the passphrase and no other.
func TestValidateAcceptsSynthesizedHeader(t *testing.T) {
	pass := []byte("passphrase")
	head := synth(t, testVolumeKey(), pass, 3)
	h, err := Validate(head, testUUID)
	if err != nil {
		t.Fatal(err)
	}
	if h.UUID != testUUID || h.SeqID != 1 || h.Generation != 3 || h.Area != AreaA || h.Prior != nil {
		t.Fatalf("header %+v", h)
	}
	sp, err := SlotParamsOf(h.JSON)
	if err != nil {
		t.Fatal(err)
	}
	vk, err := UnwrapVolumeKey(head[h.Area:h.Area+KeyslotAreaSize], pass, sp)
	if err != nil || !bytes.Equal(vk, testVolumeKey()) {
		t.Fatalf("unwrap: %v", err)
	}
	if _, err := UnwrapVolumeKey(head[h.Area:h.Area+KeyslotAreaSize], []byte("passphrasf"), sp); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("wrong passphrase: %v, want ErrWrongKey", err)
	}
}

// Edits a host can make, each with the checksum recomputed (the host
// can), are refused with the exact reason.
func TestValidateRefusesEditedSynthesizedHeader(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(head []byte)
		want string
	}{
		{"cipher_null segment", jsonEdit(`"encryption":"aes-xts-plain64","sector_size"`, `"encryption":"cipher_null-ecb","sector_size"`),
			`primary header: checksum mismatch`},
		{"cipher_null segment, both copies resummed", onCopies([]int{0, SecondaryOffset}, jsonEdit(`"encryption":"aes-xts-plain64","sector_size"`, `"encryption":"cipher_null-ecb","sector_size"`)),
			`LUKS2 header rejected: segments.0.encryption is "cipher_null-ecb", want "aes-xts-plain64"`},
		{"token added", onCopies([]int{0, SecondaryOffset}, jsonEdit(`"tokens":{}`, `"tokens":{"0":{"type":"host-escrow","keyslots":["0"]}}`)),
			`LUKS2 header rejected: tokens.0 is a token of type "host-escrow", want "latchkey-offline"`},
		{"duplicate key", onCopies([]int{0, SecondaryOffset}, jsonEdit(`"tokens":{}`, `"tokens":{},"tokens":{}`)),
			`LUKS2 header rejected: JSON metadata: duplicate key "tokens"`},
		{"subsystem latchkey-g0", onCopies([]int{0, SecondaryOffset}, binEdit(func(b []byte) { copy(b[OffSubsystem:], "latchkey-g0") })),
			`LUKS2 header rejected: primary header: subsystem "latchkey-g0", want none or latchkey-g<generation>`},
		// Slipping past: the edit in the secondary copy only, which
		// luks.go would fall back to were the primary damaged.
		{"token added to the secondary only", onCopies([]int{SecondaryOffset}, jsonEdit(`"tokens":{}`, `"tokens":{"0":{"type":"host-escrow","keyslots":["0"]}}`)),
			`LUKS2 header rejected: primary and secondary headers differ (secondary: tokens.0 is a token of type "host-escrow", want "latchkey-offline")`},
		{"control: unedited", func([]byte) {}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			head := synth(t, testVolumeKey(), []byte("p"), 0)
			c.edit(head)
			_, err := Validate(head, testUUID)
			if c.want == "" {
				if err != nil {
					t.Fatalf("control: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want %q", err, c.want)
			}
		})
	}
}

// jsonEdit replaces old by new in the JSON of the copy it is given (the
// primary when given the whole head; checksum kept, so the copy is
// wrong); onCopies applies an edit to the copies at offsets and
// recomputes their checksums, as a host can.
func jsonEdit(old, new string) func(head []byte) {
	return func(head []byte) {
		a := head[BinHeaderSize:HeaderSize]
		js := strings.Replace(cString(a), old, new, 1)
		clear(a)
		copy(a, js)
	}
}

func binEdit(edit func(b []byte)) func(head []byte) {
	return func(head []byte) { edit(head[:BinHeaderSize]); SetChecksum(head[:HeaderSize]) }
}

func onCopies(offsets []int, edit func(copy []byte)) func(head []byte) {
	return func(head []byte) {
		for _, off := range offsets {
			c := head[off : off+HeaderSize]
			edit(c)
			SetChecksum(c)
		}
	}
}

// EncodeCopy reproduces an accepted copy byte for byte: the contract the
// rewrap relies on when it re-encodes a header.
func TestEncodeCopyReproducesAcceptedCopy(t *testing.T) {
	head := synth(t, testVolumeKey(), []byte("p"), 9)
	h, err := Validate(head, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{0, SecondaryOffset} {
		if got := EncodeCopy(head[off:off+HeaderSize], h.SeqID, h.Generation, h.JSON); !bytes.Equal(got, head[off:off+HeaderSize]) {
			t.Fatalf("copy at %d re-encodes differently", off)
		}
	}
}

// A record round-trips; a slot of another disk, or torn, is refused with
// the reason; blank slots are no record.
func TestRecord(t *testing.T) {
	raw := make([]byte, 2*RecordSlotSize)
	if rec, err := NewestRecord(raw, testUUID); rec != nil || err != nil {
		t.Fatalf("blank: %v %v", rec, err)
	}
	for seq, state := range []string{RecordMkfs, RecordReady} {
		slot, off, err := EncodeRecord(Record{UUID: testUUID, Seq: uint64(seq), State: state, FSType: "ext4"})
		if err != nil {
			t.Fatal(err)
		}
		copy(raw[off-RecordOffset:], slot)
	}
	rec, err := NewestRecord(raw, testUUID)
	if err != nil || *rec != (Record{UUID: testUUID, Seq: 1, State: RecordReady, FSType: "ext4"}) {
		t.Fatalf("newest: %+v %v", rec, err)
	}
	if _, err := NewestRecord(raw, "00000000-0000-4000-8000-000000000000"); errString(err) !=
		"state record belongs to disk "+testUUID+", not 00000000-0000-4000-8000-000000000000" {
		t.Fatalf("other disk: %v", err)
	}
	raw[RecordSlotSize+100] ^= 1 // the newer slot torn: the older stands
	if rec, err := NewestRecord(raw, testUUID); err != nil || rec.State != RecordMkfs {
		t.Fatalf("torn newer slot: %+v %v", rec, err)
	}
	raw[100] ^= 1
	if _, err := NewestRecord(raw, testUUID); errString(err) != "state record slot 1: checksum mismatch" {
		t.Fatalf("both torn: %v", err)
	}
}
