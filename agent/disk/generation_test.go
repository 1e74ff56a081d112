package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"github.com/latchkey/latchkey/agent/disk/luks2"
	"strings"
	"testing"
)

// rewrapFixture is a header made by latchkey's luksFormat under key 0
// and the rewrap of it to generation 1, built in memory.
func rewrapFixture(t *testing.T) (head []byte, w *rewrapWrite) {
	t.Helper()
	head = headerFixture(t, fixtureUUID, genKey(0))
	h, err := luks2.Validate(head, fixtureUUID)
	if err != nil {
		t.Fatal(err)
	}
	base := luks2.Copy{SeqID: h.SeqID, JSON: h.JSON, Generation: h.Generation, Area: h.Area}
	_, vk, _, err := unlockCopy(head, []luks2.Copy{base}, ticketKeys(0, nil))
	if err != nil {
		t.Fatal(err)
	}
	w, err = buildRewrap(head, base, vk, ticketKeys(1, &h.Generation))
	if err != nil {
		t.Fatal(err)
	}
	return head, w
}

// transitional is head with the rewrap's keyslot and primary copy
// written, the secondary still the old one: a kill after step 3.
func transitional(head []byte, w *rewrapWrite) []byte {
	t := bytes.Clone(head)
	copy(t[w.keyslotAt:], w.keyslot)
	copy(t[0:], w.primary)
	return t
}

// recopy rewrites one 16 KiB copy at off with its binary header changed
// by edit and its JSON replaced by js (nil: kept), checksum recomputed.
func recopy(head []byte, off int, js []byte, edit func(b []byte)) {
	c := head[off : off+luks2.HeaderSize]
	if js != nil {
		clear(c[luks2.BinHeaderSize:])
		copy(c[luks2.BinHeaderSize:], js)
	}
	if edit != nil {
		edit(c)
	}
	clear(c[luks2.OffCsum : luks2.OffCsum+64])
	sum := sha256.Sum256(c)
	copy(c[luks2.OffCsum:], sum[:])
}

func setSubsystem(s string) func([]byte) {
	return func(b []byte) {
		clear(b[luks2.OffSubsystem : luks2.OffSubsystem+48])
		copy(b[luks2.OffSubsystem:], s)
	}
}

func TestValidateRewrappedAndTransitionalHeaders(t *testing.T) {
	head, w := rewrapFixture(t)
	h, err := luks2.Validate(w.head, fixtureUUID)
	if err != nil || h.Prior != nil || h.Generation != 1 || h.Area != luks2.AreaB {
		t.Fatalf("rewrapped header: %+v %v", h, err)
	}
	if _, err := unsealDetached(w.head, genKey(1), "", luks2.DataOffset+mib); err != nil {
		t.Fatalf("luks.go does not open the rewrapped header with the new key: %v", err)
	}
	if _, err := unsealDetached(w.head, genKey(0), "", luks2.DataOffset+mib); err == nil {
		t.Fatal("luks.go opens the rewrapped header with the old key")
	}
	tr := transitional(head, w)
	h, err = luks2.Validate(tr, fixtureUUID)
	if err != nil || h.Prior == nil || h.Generation != 1 || h.Prior.Generation != 0 || h.Area != luks2.AreaB || h.Prior.Area != luks2.AreaA {
		t.Fatalf("transitional header: %+v %v", h, err)
	}
	if g := planGeneration(h); *g != 0 {
		t.Fatalf("a transitional header's Hello names generation %d, want the older copy's 0", *g)
	}
}

// Every other difference between the copies, and every subsystem but
// none or latchkey-g<n>, is refused, with what was wrong.
func TestValidateRefusesOtherGenerationStates(t *testing.T) {
	head, w := rewrapFixture(t)
	newJS, _ := luks2.JSONArea(w.primary[luks2.BinHeaderSize:])
	oldJS, _ := luks2.JSONArea(head[luks2.BinHeaderSize:luks2.HeaderSize])
	seqOf := func(b []byte) uint64 { return luks2.ParseBinary(b).SeqID }
	setSeq := func(n uint64) func([]byte) {
		return func(b []byte) {
			for i := range 8 {
				b[luks2.OffSeqID+i] = byte(n >> (56 - 8*i))
			}
		}
	}
	cases := []struct {
		name string
		make func() []byte
		want string
	}{
		{"subsystem latchkey-g0", func() []byte {
			b := bytes.Clone(head)
			recopy(b, 0, nil, setSubsystem("latchkey-g0"))
			recopy(b, luks2.SecondaryOffset, nil, setSubsystem("latchkey-g0"))
			return b
		}, `primary header: subsystem "latchkey-g0", want none or latchkey-g<generation>`},
		{"subsystem with a leading zero", func() []byte {
			b := bytes.Clone(head)
			recopy(b, 0, nil, setSubsystem("latchkey-g01"))
			return b
		}, `subsystem "latchkey-g01"`},
		{"foreign subsystem", func() []byte {
			b := bytes.Clone(head)
			recopy(b, 0, nil, setSubsystem("systemd-cryptenroll"))
			return b
		}, `subsystem "systemd-cryptenroll"`},
		{"generation too large", func() []byte {
			b := bytes.Clone(head)
			recopy(b, 0, nil, setSubsystem("latchkey-g2147483648"))
			return b
		}, `subsystem "latchkey-g2147483648"`},
		{"copies differ in generation only", func() []byte {
			b := bytes.Clone(head)
			recopy(b, 0, nil, setSubsystem("latchkey-g1"))
			return b
		}, "primary and secondary headers differ (seqid"},
		{"seqid two apart", func() []byte {
			b := transitional(head, w)
			recopy(b, 0, nil, setSeq(seqOf(head)+2))
			return b
		}, "primary and secondary headers differ (seqid"},
		{"secondary newer than primary", func() []byte {
			b := bytes.Clone(head)
			copy(b[w.keyslotAt:], w.keyslot)
			copy(b[luks2.SecondaryOffset:], w.second)
			return b
		}, "primary and secondary headers differ (seqid"},
		{"same area", func() []byte {
			b := transitional(head, w)
			sp, _ := luks2.SlotParamsOf(newJS)
			js, err := luks2.WithSlot(newJS, sp, luks2.AreaA, sp.KDFSalt)
			if err != nil {
				t.Fatal(err)
			}
			recopy(b, 0, js, nil)
			return b
		}, "both copies use the same keyslot area"},
		{"digest changed too", func() []byte {
			b := transitional(head, w)
			sp, _ := luks2.SlotParamsOf(newJS)
			other := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
			js := bytes.Replace(newJS, []byte(base64.StdEncoding.EncodeToString(sp.DigestSalt)), []byte(other), 1)
			recopy(b, 0, js, nil)
			return b
		}, "metadata differs beyond keyslot 0's area and salt"},
		{"new area empty", func() []byte {
			b := transitional(head, w)
			clear(b[luks2.AreaB : luks2.AreaB+luks2.KeyslotAreaSize])
			return b
		}, "keyslot area at 290816 holds no key material"},
		{"old area empty", func() []byte {
			b := transitional(head, w)
			clear(b[luks2.AreaA : luks2.AreaA+luks2.KeyslotAreaSize])
			return b
		}, "keyslot area at 32768 holds no key material"},
		{"third area", func() []byte {
			b := bytes.Clone(head)
			js := bytes.Replace(oldJS, []byte(`"offset":"32768"`), []byte(`"offset":"548864"`), 1)
			recopy(b, 0, js, nil)
			recopy(b, luks2.SecondaryOffset, js, nil)
			return b
		}, `keyslots.0.area.offset is "548864", want one of ["32768" "290816"]`},
	}
	for _, tc := range cases {
		_, err := luks2.Validate(tc.make(), fixtureUUID)
		if !errors.Is(err, ErrHeaderRejected) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a rejection containing %q", tc.name, err, tc.want)
		}
	}
}
