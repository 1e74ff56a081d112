package disk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anatol/luks.go"
)

// rewriteJSON replaces the JSON metadata of both header copies with
// edit(json) and recomputes both checksums, as a host that controls the
// disk can.
func rewriteJSON(t *testing.T, dev string, edit func(string) string) {
	t.Helper()
	area := readDev(t, dev, 0, keyslotsOffset)
	js := cString(area[binHeaderSize:hdrSize])
	edited := edit(js)
	if edited == js {
		t.Fatal("edit changed nothing")
	}
	if len(edited) >= jsonAreaSize {
		t.Fatal("edited JSON too large")
	}
	for _, off := range []int{0, secondaryOffset} {
		a := area[off : off+hdrSize]
		clear(a[binHeaderSize:])
		copy(a[binHeaderSize:], edited)
		resum(a)
	}
	writeDev(t, dev, 0, area)
}

// rewriteBin edits the binary header fields of the copies listed.
func rewriteBin(t *testing.T, dev string, offsets []int, edit func(h []byte)) {
	t.Helper()
	area := readDev(t, dev, 0, keyslotsOffset)
	for _, off := range offsets {
		edit(area[off : off+binHeaderSize])
		resum(area[off : off+hdrSize])
	}
	writeDev(t, dev, 0, area)
}

func resum(a []byte) {
	clear(a[offCsum : offCsum+64])
	sum := sha256.Sum256(a[:hdrSize])
	copy(a[offCsum:], sum[:])
}

type hostileCase struct {
	name   string
	mutate func(t *testing.T, dev string, key []byte)
	reason string // must appear in the refusal
	// unsealable: luks.go alone would still unseal this header with the
	// ticket key, i.e. without validation the agent would go on to map it.
	unsealable bool
}

func jsonEdit(old, new string) func(t *testing.T, dev string, key []byte) {
	return func(t *testing.T, dev string, _ []byte) {
		rewriteJSON(t, dev, func(js string) string { return strings.Replace(js, old, new, 1) })
	}
}

var hostileCases = []hostileCase{
	{"cipher_null segment", jsonEdit(`"encryption":"aes-xts-plain64","sector_size"`, `"encryption":"cipher_null-ecb","sector_size"`), `segments.0.encryption is "cipher_null-ecb", want "aes-xts-plain64"`, true},
	{"other cipher", jsonEdit(`"encryption":"aes-xts-plain64","sector_size"`, `"encryption":"aes-cbc-essiv:sha256","sector_size"`), `segments.0.encryption is "aes-cbc-essiv:sha256"`, true},
	{"smaller key", jsonEdit(`"key_size":64,"af"`, `"key_size":32,"af"`), `keyslots.0.key_size is number 32, want number 64`, false},
	{"smaller sector", jsonEdit(`"sector_size":4096`, `"sector_size":512`), `segments.0.sector_size is number 512, want number 4096`, true},
	{"moved segment offset", jsonEdit(`"offset":"16777216"`, `"offset":"33554432"`), `segments.0.offset is "33554432", want "16777216"`, true},
	{"integrity added", jsonEdit(`"sector_size":4096`, `"sector_size":4096, "integrity":{"type":"hmac(sha256)","journal_encryption":"none","journal_integrity":"none"}`), `segments.0 has unexpected "integrity"`, true},
	{"token added", jsonEdit(`"tokens":{}`, `"tokens":{"0":{"type":"host-escrow","keyslots":["0"]}}`), `tokens.0 is a token of type "host-escrow", want "latchkey-offline"`, true},
	{"flags added", jsonEdit(`"json_size":"12288",`, `"json_size":"12288", "flags":["allow-discards"],`), `config has unexpected "flags"`, true},
	{"kdf weakened", jsonEdit(`"iterations":1000,"salt"`, `"iterations":1,"salt"`), `keyslots.0.kdf.iterations is number 1, want number 1000`, false},
	{"duplicate segments key", func(t *testing.T, dev string, _ []byte) {
		rewriteJSON(t, dev, func(js string) string {
			i := strings.LastIndex(js, "}")
			return js[:i] + `,"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"cipher_null-ecb","sector_size":4096}}}`
		})
	}, `duplicate key "segments"`, true},
	{"case-variant key", func(t *testing.T, dev string, _ []byte) {
		rewriteJSON(t, dev, func(js string) string {
			i := strings.LastIndex(js, "}")
			return js[:i] + `,"Segments":{}}`
		})
	}, `metadata has unexpected "Segments"`, true},
	{"second document after the JSON", func(t *testing.T, dev string, _ []byte) {
		rewriteJSON(t, dev, func(js string) string { return js + " {}" })
	}, "trailing data", true},
	{"extra keyslot with a host passphrase", func(t *testing.T, dev string, key []byte) {
		hostKey := filepath.Join(t.TempDir(), "host-passphrase")
		if err := os.WriteFile(hostKey, []byte("the host knows this"), 0o600); err != nil {
			t.Fatal(err)
		}
		run(t, key, "cryptsetup", "luksAddKey", "--batch-mode", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
			"--key-file", "-", dev, hostKey)
	}, `keyslots has unexpected "1"`, true},
	{"label changed", func(t *testing.T, dev string, _ []byte) {
		rewriteBin(t, dev, []int{0, secondaryOffset}, func(h []byte) { copy(h[offLabel:], "other\x00\x00\x00\x00\x00\x00\x00\x00\x00") })
	}, `label "other", want "latchkey-state"`, true},
	{"primary edited only", func(t *testing.T, dev string, _ []byte) {
		rewriteBin(t, dev, []int{0}, func(h []byte) { binary.BigEndian.PutUint64(h[offSeqID:], 99) })
	}, "primary and secondary headers differ", true},
	{"checksum not recomputed", func(t *testing.T, dev string, _ []byte) {
		area := readDev(t, dev, 0, hdrSize)
		copy(area[binHeaderSize:], bytes.Replace(area[binHeaderSize:], []byte(`"aes-xts-plain64","sector_size"`), []byte(`"cipher_null-ecb","sector_size"`), 1))
		if bytes.Equal(area, readDev(t, dev, 0, hdrSize)) {
			t.Fatal("edit changed nothing")
		}
		writeDev(t, dev, 0, area)
	}, "checksum mismatch", true},
}

func TestHostileHeadersRefusedBeforeUnlock(t *testing.T) {
	requireRoot(t)
	key := testKey(11)
	for _, c := range hostileCases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, testDiskSize)
			plan, _ := r.mustBoot(r.stage(nil), key)
			r.kernel.powerOff()
			c.mutate(t, r.dev, key)
			if c.unsealable {
				assertLuksGoWouldUnseal(t, r.dev, key)
			}
			mapped := r.kernel.mapped()

			_, err := r.stage(nil).Prepare(context.Background())
			if !errors.Is(err, ErrHeaderRejected) || !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("Prepare: %v\nwant ErrHeaderRejected naming %q", err, c.reason)
			}
			// An agent holding the rejoin plan from before the swap
			// refuses in Open, before unsealing.
			before := checksum(t, r.dev)
			_, err = r.stage(nil).Open(context.Background(), plan, key)
			if !errors.Is(err, ErrHeaderRejected) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("Open: %v\nwant ErrHeaderRejected naming %q", err, c.reason)
			}
			if r.kernel.mapped() != mapped {
				t.Fatal("hostile header was mapped")
			}
			if checksum(t, r.dev) != before {
				t.Fatal("device changed")
			}
		})
	}
}

// assertLuksGoWouldUnseal shows the threat is real: luks.go by itself
// opens the edited header with the ticket's key.
func assertLuksGoWouldUnseal(t *testing.T, dev string, key []byte) {
	t.Helper()
	d, err := luks.Open(dev)
	if err != nil {
		return // luks.go refuses this one by itself (checksum)
	}
	defer d.Close()
	if _, err := d.UnsealVolume(0, key); err != nil {
		t.Fatalf("luks.go does not unseal the hostile header (%v); the case tests nothing", err)
	}
}
