package disk

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/anatol/luks.go"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/protocol"
)

const testDiskSize = 64 << 20

// luksDump is the part of `cryptsetup luksDump --dump-json-metadata` the
// tests check, decoded independently of the validator.
type luksDump struct {
	Keyslots map[string]struct {
		Type    string `json:"type"`
		KeySize int    `json:"key_size"`
		Area    struct {
			Encryption string `json:"encryption"`
			KeySize    int    `json:"key_size"`
			Offset     string `json:"offset"`
		} `json:"area"`
		KDF struct {
			Type       string `json:"type"`
			Hash       string `json:"hash"`
			Iterations int    `json:"iterations"`
		} `json:"kdf"`
	} `json:"keyslots"`
	Tokens   map[string]any `json:"tokens"`
	Segments map[string]struct {
		Type       string `json:"type"`
		Offset     string `json:"offset"`
		Size       string `json:"size"`
		Encryption string `json:"encryption"`
		SectorSize int    `json:"sector_size"`
	} `json:"segments"`
	Digests map[string]struct {
		Type       string `json:"type"`
		Iterations int    `json:"iterations"`
	} `json:"digests"`
}

func TestFirstBootFormatsExactly(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(1)
	l := r.stage(nil)

	// A ticket that never comes leaves the disk as it was.
	before := checksum(t, r.dev)
	plan, err := l.Prepare(context.Background())
	if err != nil || plan.Rejoin || !protocol.ValidDiskUUID(plan.UUID) {
		t.Fatalf("Prepare on a blank disk = %+v, %v; want a fresh UUID, no rejoin", plan, err)
	}
	if checksum(t, r.dev) != before {
		t.Fatal("Prepare wrote to the disk")
	}

	res, err := l.Open(context.Background(), plan, Keys{Current: key})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !res.Formatted || !res.MadeFileSystem || res.FSType != "ext4" || res.UUID != plan.UUID || res.HasKubeletCredentials {
		t.Fatalf("result = %+v", res)
	}
	checkFormatParameters(t, r.dev, plan.UUID)
	checkKeyBehaviour(t, r.dev, key)
	checkSecretsStayedOut(t, r, key)
	if got := strings.TrimSpace(run(t, nil, "blkid", "-p", "-s", "TYPE", "-o", "value", res.Device)); got != "ext4" {
		t.Fatalf("opened volume holds %q, want ext4", got)
	}
}

func checkFormatParameters(t *testing.T, dev, uuid string) {
	t.Helper()
	var dump luksDump
	if err := json.Unmarshal([]byte(run(t, nil, "cryptsetup", "luksDump", "--dump-json-metadata", dev)), &dump); err != nil {
		t.Fatal(err)
	}
	ks, ok := dump.Keyslots["0"]
	if len(dump.Keyslots) != 1 || !ok || ks.Type != "luks2" || ks.KeySize != 64 ||
		ks.KDF.Type != "pbkdf2" || ks.KDF.Hash != "sha256" || ks.KDF.Iterations != 1000 ||
		ks.Area.Encryption != "aes-xts-plain64" || ks.Area.KeySize != 64 || ks.Area.Offset != "32768" {
		t.Errorf("keyslots = %+v", dump.Keyslots)
	}
	seg, ok := dump.Segments["0"]
	if len(dump.Segments) != 1 || !ok || seg.Type != "crypt" || seg.Encryption != "aes-xts-plain64" ||
		seg.SectorSize != 4096 || seg.Offset != "16777216" || seg.Size != "dynamic" {
		t.Errorf("segments = %+v", dump.Segments)
	}
	if dg := dump.Digests["0"]; len(dump.Digests) != 1 || dg.Type != "pbkdf2" || dg.Iterations != 1000 {
		t.Errorf("digests = %+v", dump.Digests)
	}
	if len(dump.Tokens) != 0 {
		t.Errorf("tokens = %v", dump.Tokens)
	}
	text := run(t, nil, "cryptsetup", "luksDump", dev)
	for _, want := range []string{"Version:       \t2", "UUID:          \t" + uuid, "Label:         \t" + luks2.HeaderLabel, "Key:        512 bits"} {
		if !strings.Contains(text, want) {
			t.Errorf("luksDump lacks %q:\n%s", want, text)
		}
	}

	d, err := luks.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Version() != 2 || d.UUID() != uuid || !slices.Equal(d.Slots(), []int{0}) {
		t.Errorf("luks.go sees version %d, UUID %s, slots %v", d.Version(), d.UUID(), d.Slots())
	}
}

// checkKeyBehaviour: luks.go unseals with the ticket's key and refuses
// another, and cryptsetup agrees on both.
func checkKeyBehaviour(t *testing.T, dev string, key []byte) {
	t.Helper()
	d, err := luks.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	vol, err := d.UnsealVolume(0, key)
	if err != nil {
		t.Fatalf("luks.go unseal with the ticket key: %v", err)
	}
	if vol.StorageEncryption != "aes-xts-plain64" || vol.StorageSectorSize != 4096 || vol.StorageOffset != luks2.DataOffset {
		t.Errorf("luks.go volume = %s/%d/%d", vol.StorageEncryption, vol.StorageSectorSize, vol.StorageOffset)
	}
	wrong := testKey(2)
	if _, err := d.UnsealVolume(0, wrong); !errors.Is(err, luks.ErrPassphraseDoesNotMatch) {
		t.Fatalf("luks.go unseal with a wrong key: %v, want ErrPassphraseDoesNotMatch", err)
	}
	test := func(k []byte) error {
		_, err := realRunner.Run(context.Background(), execx.Cmd{Name: "cryptsetup",
			Args: []string{"open", "--test-passphrase", "--key-file", "-", dev}, Stdin: bytes.NewReader(k)})
		return err
	}
	if err := test(key); err != nil {
		t.Fatalf("cryptsetup --test-passphrase with the ticket key: %v", err)
	}
	if err := test(wrong); execx.ExitCode(err) != 2 {
		t.Fatalf("cryptsetup --test-passphrase with a wrong key: %v, want exit 2 (no key available)", err)
	}
}

// checkSecretsStayedOut: the key went to cryptsetup on stdin only, never
// in an argument, and never into a log.
func checkSecretsStayedOut(t *testing.T, r *testRig, key []byte) {
	t.Helper()
	formats := 0
	for _, c := range r.rec.Calls() {
		line := c.Cmd.String()
		if strings.Contains(line, string(key)) || strings.Contains(line, hex.EncodeToString(key)) {
			t.Errorf("key in argv: %s", line)
		}
		if strings.HasPrefix(line, "cryptsetup luksFormat") {
			formats++
			if !bytes.Equal(c.Stdin, key) || !slices.Contains(c.Cmd.Args, "--key-file") {
				t.Errorf("luksFormat did not get the key on stdin: %s", line)
			}
		}
	}
	if formats != 1 {
		t.Errorf("luksFormat ran %d times, want 1", formats)
	}
	logs := r.logs.String()
	if strings.Contains(logs, hex.EncodeToString(key)) || bytes.Contains(r.logs.Bytes(), key) {
		t.Error("key in the log")
	}
	if !strings.Contains(logs, `"cmd":"cryptsetup"`) {
		t.Errorf("cryptsetup run not logged: %s", logs)
	}
}

func TestRebootTakesRejoinPath(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(3)
	first, res := r.mustBoot(r.stage(nil), key)
	marker := filepath.Join(r.root, "var/lib/kubelet/pki/kubelet-client-current.pem")
	if err := os.MkdirAll(filepath.Dir(marker), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(marker, []byte("cert"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.kernel.powerOff()
	header := readDev(t, r.dev, 0, luks2.DataOffset)

	l := r.stage(nil)
	plan, res2 := r.mustBoot(l, key)
	if !plan.Rejoin || plan.UUID != first.UUID {
		t.Fatalf("reboot plan = %+v, want rejoin with %s", plan, first.UUID)
	}
	if res2.Formatted || res2.MadeFileSystem || !res2.HasKubeletCredentials || res2.UUID != res.UUID {
		t.Fatalf("reboot result = %+v", res2)
	}
	if n := r.rec.Ran("cryptsetup") + r.rec.Ran("mkfs"); n != 0 {
		t.Fatalf("reboot ran cryptsetup or mkfs %d times", n)
	}
	if !bytes.Equal(readDev(t, r.dev, 0, luks2.DataOffset), header) {
		t.Fatal("reboot changed the header area")
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "cert" {
		t.Fatalf("file written before the reboot: %q, %v", b, err)
	}

	// A wrong key on reboot: refused, nothing mapped, nothing written.
	r.kernel.powerOff()
	mapped := r.kernel.mapped()
	before := checksum(t, r.dev)
	_, _, err := r.boot(r.stage(nil), testKey(4))
	if !errors.Is(err, luks.ErrPassphraseDoesNotMatch) {
		t.Fatalf("wrong key: %v, want ErrPassphraseDoesNotMatch", err)
	}
	if r.kernel.mapped() != mapped || checksum(t, r.dev) != before {
		t.Fatal("a wrong key mapped or changed something")
	}
}

func TestSameBootRerunAdoptsMounts(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(5)
	_, res := r.mustBoot(r.stage(nil), key)
	_, res2 := r.mustBoot(r.stage(nil), key) // agent restarted, nothing unmounted
	if res2.Device != res.Device || res2.Formatted || res2.MadeFileSystem {
		t.Fatalf("rerun result = %+v, first %+v", res2, res)
	}
}

func TestXFS(t *testing.T) {
	r := newRig(t, 320<<20) // mkfs.xfs wants 300 MiB
	_, res := r.mustBoot(r.stage(func(c *LUKSConfig) { c.FSType = "xfs" }), testKey(6))
	if res.FSType != "xfs" {
		t.Fatalf("FSType = %q", res.FSType)
	}
	r.kernel.powerOff()
	// The config now says ext4: the existing xfs is mounted as what it is.
	_, res2 := r.mustBoot(r.stage(nil), testKey(6))
	if res2.FSType != "xfs" || res2.MadeFileSystem {
		t.Fatalf("reboot result = %+v", res2)
	}
}
