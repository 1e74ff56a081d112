package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// rewrapFixture is a header made by latchkey's luksFormat under key 0
// and the rewrap of it to generation 1, built in memory.
func rewrapFixture(t *testing.T) (head []byte, w *rewrapWrite) {
	t.Helper()
	head = headerFixture(t, fixtureUUID, genKey(0))
	h, err := validateHeader(head, fixtureUUID)
	if err != nil {
		t.Fatal(err)
	}
	base := headerCopy{seqID: h.seqID, json: h.json, generation: h.generation, area: h.area}
	_, vk, _, err := unlockCopy(head, []headerCopy{base}, ticketKeys(0, nil))
	if err != nil {
		t.Fatal(err)
	}
	w, err = buildRewrap(head, base, vk, ticketKeys(1, &h.generation))
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
	c := head[off : off+hdrSize]
	if js != nil {
		clear(c[binHeaderSize:])
		copy(c[binHeaderSize:], js)
	}
	if edit != nil {
		edit(c)
	}
	clear(c[offCsum : offCsum+64])
	sum := sha256.Sum256(c)
	copy(c[offCsum:], sum[:])
}

func setSubsystem(s string) func([]byte) {
	return func(b []byte) {
		clear(b[offSubsystem : offSubsystem+48])
		copy(b[offSubsystem:], s)
	}
}

func TestValidateRewrappedAndTransitionalHeaders(t *testing.T) {
	head, w := rewrapFixture(t)
	h, err := validateHeader(w.head, fixtureUUID)
	if err != nil || h.prior != nil || h.generation != 1 || h.area != areaB {
		t.Fatalf("rewrapped header: %+v %v", h, err)
	}
	if _, err := unsealDetached(w.head, genKey(1), "", DataOffset+mib); err != nil {
		t.Fatalf("luks.go does not open the rewrapped header with the new key: %v", err)
	}
	if _, err := unsealDetached(w.head, genKey(0), "", DataOffset+mib); err == nil {
		t.Fatal("luks.go opens the rewrapped header with the old key")
	}
	tr := transitional(head, w)
	h, err = validateHeader(tr, fixtureUUID)
	if err != nil || h.prior == nil || h.generation != 1 || h.prior.generation != 0 || h.area != areaB || h.prior.area != areaA {
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
	newJS, _ := jsonArea(w.primary[binHeaderSize:])
	oldJS, _ := jsonArea(head[binHeaderSize:hdrSize])
	seqOf := func(b []byte) uint64 { return parseBinHeader(b).seqID }
	setSeq := func(n uint64) func([]byte) {
		return func(b []byte) {
			for i := range 8 {
				b[offSeqID+i] = byte(n >> (56 - 8*i))
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
			recopy(b, secondaryOffset, nil, setSubsystem("latchkey-g0"))
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
			copy(b[secondaryOffset:], w.second)
			return b
		}, "primary and secondary headers differ (seqid"},
		{"same area", func() []byte {
			b := transitional(head, w)
			sp, _ := slotParamsOf(newJS)
			js, err := withSlot(newJS, sp, areaA, sp.kdfSalt)
			if err != nil {
				t.Fatal(err)
			}
			recopy(b, 0, js, nil)
			return b
		}, "both copies use the same keyslot area"},
		{"digest changed too", func() []byte {
			b := transitional(head, w)
			sp, _ := slotParamsOf(newJS)
			other := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
			js := bytes.Replace(newJS, []byte(base64.StdEncoding.EncodeToString(sp.digestSalt)), []byte(other), 1)
			recopy(b, 0, js, nil)
			return b
		}, "metadata differs beyond keyslot 0's area and salt"},
		{"new area empty", func() []byte {
			b := transitional(head, w)
			clear(b[areaB : areaB+keyslotAreaSize])
			return b
		}, "keyslot area at 290816 holds no key material"},
		{"old area empty", func() []byte {
			b := transitional(head, w)
			clear(b[areaA : areaA+keyslotAreaSize])
			return b
		}, "keyslot area at 32768 holds no key material"},
		{"third area", func() []byte {
			b := bytes.Clone(head)
			js := bytes.Replace(oldJS, []byte(`"offset":"32768"`), []byte(`"offset":"548864"`), 1)
			recopy(b, 0, js, nil)
			recopy(b, secondaryOffset, js, nil)
			return b
		}, `keyslots.0.area.offset is "548864", want one of ["32768" "290816"]`},
	}
	for _, tc := range cases {
		_, err := validateHeader(tc.make(), fixtureUUID)
		if !errors.Is(err, ErrHeaderRejected) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a rejection containing %q", tc.name, err, tc.want)
		}
	}
}

func TestParseSubsystem(t *testing.T) {
	field := func(s string) []byte { b := make([]byte, 48); copy(b, s); return b }
	for s, want := range map[string]uint32{"": 0, "latchkey-g1": 1, "latchkey-g42": 42, "latchkey-g2147483647": MaxKeyGeneration} {
		if got, err := parseSubsystem(field(s)); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", s, got, err, want)
		}
		if subsystemName(want) != s {
			t.Errorf("subsystemName(%d) = %q, want %q", want, subsystemName(want), s)
		}
	}
	junk := field("latchkey-g1")
	junk[40] = 'x' // text after the NUL
	for _, b := range [][]byte{field("latchkey-g"), field("latchkey-g-1"), field("latchkey-g+1"), field("latchkey-g1 "), field("LATCHKEY-G1"), junk} {
		if _, err := parseSubsystem(b); err == nil {
			t.Errorf("%q accepted", b)
		}
	}
}
