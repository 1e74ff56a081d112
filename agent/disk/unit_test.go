package disk

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/execx/execxtest"
)

// headerFixture formats an image file with latchkey's exact luksFormat
// command (no root needed) and returns its first luks2.HeadAndKeyslot bytes.
func headerFixture(t testing.TB, uuid string, key []byte) []byte {
	t.Helper()
	img := filepath.Join(t.TempDir(), "hdr.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, imageSize); err != nil {
		t.Fatal(err)
	}
	res, err := realRunner.Run(context.Background(), execx.Cmd{Name: "cryptsetup", Args: luks2.FormatArgs(uuid, img), Stdin: strings.NewReader(string(key))})
	if errors.Is(err, os.ErrNotExist) || strings.Contains(errString(err), "not found") {
		t.Skip("needs cryptsetup (apt-get install cryptsetup-bin)")
	}
	if err != nil {
		t.Fatalf("luksFormat: %v (%s)", err, res.Stderr)
	}
	b, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	return b[:luks2.HeadAndKeyslot]
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

const fixtureUUID = "2b1e0c38-6a55-4d7e-9a1d-1e7a0f1c2b3d"

func TestValidateHeaderAcceptsOwnFormat(t *testing.T) {
	head := headerFixture(t, fixtureUUID, testKey(1))
	h, err := luks2.Validate(head, fixtureUUID)
	if err != nil {
		t.Fatalf("luks2.Validate: %v", err)
	}
	if h.UUID != fixtureUUID {
		t.Fatalf("uuid = %s", h.UUID)
	}
	if _, err := luks2.Validate(head, "00000000-0000-4000-8000-000000000000"); !errors.Is(err, ErrHeaderRejected) {
		t.Fatalf("other UUID: %v, want ErrHeaderRejected", err)
	}
	if _, err := unsealDetached(head, testKey(1), "", luks2.DataOffset+mib); err != nil {
		t.Fatalf("unseal from the detached copy: %v", err)
	}
}

func TestConfigChecks(t *testing.T) {
	cases := []struct {
		cfg  LUKSConfig
		want string
	}{
		{LUKSConfig{}, "exactly one of Device and PartLabel"},
		{LUKSConfig{Device: "/dev/vdb", PartLabel: "state"}, "exactly one of Device and PartLabel"},
		{LUKSConfig{PartLabel: "a/b"}, "bad partition label"},
		{LUKSConfig{Device: "/dev/vdb", FSType: "btrfs"}, `file system "btrfs"`},
		{LUKSConfig{Device: "/dev/vdb", MountPoint: "relative"}, "clean absolute path"},
		{LUKSConfig{Device: "/dev/vdb", BindMounts: []string{"/var/lib"}}, "overlaps the mount point"},
		{LUKSConfig{Device: "/dev/vdb", BindMounts: []string{"/etc/kubernetes", "/etc/kubernetes/pki"}}, "overlap"},
		{LUKSConfig{Device: "/dev/vdb", BindMounts: []string{"/var/lib/kubelet/"}}, "clean absolute path"},
		{LUKSConfig{Device: "/dev/vdb", MapperName: "a/b"}, "bad mapper name"},
		{LUKSConfig{Device: "/dev/vdb", WipeStateDisk: "/dev/vdb"}, "names a slot, not a disk"},
		{LUKSConfig{Device: "/dev/vdb", WipeStateDisk: " serial"}, "is not a disk serial"},
	}
	for _, c := range cases {
		if _, err := NewLUKS(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewLUKS(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
	l, err := NewLUKS(LUKSConfig{Device: "/dev/vdb"})
	if err != nil {
		t.Fatal(err)
	}
	if l.cfg.MountPoint != DefaultMountPoint || l.cfg.FSType != "ext4" || len(l.cfg.BindMounts) != 4 ||
		l.cfg.WipeStateDisk != "" || l.cfg.LockTimeout != DefaultLockTimeout || l.cfg.WaitTimeout != DefaultWaitTimeout || l.cfg.MapperName != DefaultMapperName {
		t.Fatalf("defaults = %+v", l.cfg)
	}
	if l, _ := NewLUKS(LUKSConfig{PartLabel: "latchkey-state"}); l.devicePath() != "/dev/disk/by-partlabel/latchkey-state" {
		t.Fatalf("PartLabel path = %s", l.devicePath())
	}
	if l, _ := NewLUKS(LUKSConfig{Device: "/dev/vdb", BindMounts: []string{}}); len(l.cfg.BindMounts) != 0 {
		t.Fatal("an empty BindMounts list must mean none")
	}
}

// fakeClock advances on every Sleep.
type fakeClock struct {
	now    time.Time
	sleeps int
	onTick func()
}

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) Sleep(_ context.Context, d time.Duration) error {
	c.sleeps++
	c.now = c.now.Add(d)
	if c.onTick != nil {
		c.onTick()
	}
	return nil
}

func TestWaitForDeviceTimesOut(t *testing.T) {
	clk := &fakeClock{now: time.Unix(0, 0)}
	l, err := NewLUKS(LUKSConfig{Device: filepath.Join(t.TempDir(), "by-id-link"), WaitTimeout: 2 * time.Second,
		PollInterval: 100 * time.Millisecond, Now: clk.Now, Sleep: clk.Sleep, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Prepare(context.Background())
	if !errors.Is(err, os.ErrNotExist) || clk.sleeps != 20 {
		t.Fatalf("Prepare = %v after %d polls, want not-exist after 20", err, clk.sleeps)
	}
}

func TestWaitForDeviceRefusesNonBlock(t *testing.T) {
	l, _ := NewLUKS(LUKSConfig{Device: "/dev/null"})
	if _, err := l.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Fatalf("Prepare(/dev/null) = %v", err)
	}
}

func TestWaitForDeviceSeesLateLink(t *testing.T) {
	r := newRig(t, testDiskSize)
	link := filepath.Join(t.TempDir(), "by-id-link")
	clk := &fakeClock{now: time.Unix(0, 0)}
	clk.onTick = func() {
		if clk.sleeps == 5 {
			if err := os.Symlink(r.dev, link); err != nil {
				t.Fatal(err)
			}
		}
	}
	l := r.stage(func(c *LUKSConfig) { c.Device, c.Now, c.Sleep = link, clk.Now, clk.Sleep })
	plan, err := l.Prepare(context.Background())
	if err != nil || plan.Rejoin || clk.sleeps != 5 {
		t.Fatalf("Prepare = %+v, %v after %d polls", plan, err, clk.sleeps)
	}
}

// TestBlkidFailureRefuses: the sampled rule asks blkid for a second
// opinion on a disk it found blank; a blkid that fails refuses.
func TestBlkidFailureRefuses(t *testing.T) {
	r := newRig(t, testDiskSize)
	l := r.stage(func(c *LUKSConfig) { c.BlankCheck = BlankCheckSampled })
	l.cfg.Runner = &execxtest.Fake{Rules: []execxtest.Rule{{Match: "blkid", ExitCode: 4, Stderr: "blkid: probing failed"}}}
	if _, err := l.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "probing failed") {
		t.Fatalf("Prepare with a failing blkid = %v, want the failure", err)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	r := newRig(t, testDiskSize)
	d, err := openDevice(r.dev, readWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if rec, err := readRecord(d, fixtureUUID); rec != nil || err != nil {
		t.Fatalf("blank gap: %+v, %v", rec, err)
	}
	rec, err := writeRecord(d, nil, luks2.Record{UUID: fixtureUUID, State: luks2.RecordMkfs, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writeRecord(d, rec, luks2.Record{UUID: fixtureUUID, State: luks2.RecordReady, FSType: "ext4"}); err != nil {
		t.Fatal(err)
	}
	got, err := readRecord(d, fixtureUUID)
	if err != nil || got.State != luks2.RecordReady || got.Seq != 1 {
		t.Fatalf("after two writes: %+v, %v", got, err)
	}
	// A torn newer slot leaves the older one.
	writeDev(t, r.dev, luks2.RecordOffset+luks2.RecordSlotSize+100, []byte("torn"))
	if got, err := readRecord(d, fixtureUUID); err != nil || got.State != luks2.RecordMkfs {
		t.Fatalf("torn slot: %+v, %v, want the older mkfs record", got, err)
	}
	if _, err := readRecord(d, "00000000-0000-4000-8000-000000000000"); !errors.Is(err, ErrVolumeContent) {
		t.Fatalf("record of another disk: %v", err)
	}
	writeDev(t, r.dev, luks2.RecordOffset+100, []byte("torn"))
	if _, err := readRecord(d, fixtureUUID); !errors.Is(err, ErrVolumeContent) {
		t.Fatalf("both slots torn: %v, want ErrVolumeContent", err)
	}
}

func TestParseMountInfo(t *testing.T) {
	e, ok := parseMountInfoLine(`44 27 7:0 /var/lib/kubelet /tmp/with\040space rw,relatime shared:1 - ext4 /dev/dm-0 rw`)
	if !ok || e.devno != "7:0" || e.root != "/var/lib/kubelet" || e.target != "/tmp/with space" || e.fstype != "ext4" || e.source != "/dev/dm-0" {
		t.Fatalf("parsed %+v, %v", e, ok)
	}
	if _, ok := parseMountInfoLine("garbage"); ok {
		t.Fatal("garbage parsed")
	}
}

func TestKeyOnlyStillWorks(t *testing.T) {
	k := KeyOnly{UUID: fixtureUUID}
	if p, err := k.Prepare(context.Background()); err != nil || p.UUID != fixtureUUID {
		t.Fatalf("Prepare = %+v, %v", p, err)
	}
	if _, err := k.Open(context.Background(), Plan{}, Keys{Current: make([]byte, 16)}); err == nil {
		t.Fatal("short key accepted")
	}
	if _, err := (&LUKS{}).Open(context.Background(), Plan{UUID: fixtureUUID}, Keys{Current: make([]byte, 16)}); err == nil {
		t.Fatal("LUKS stage accepted a short key")
	}
}
