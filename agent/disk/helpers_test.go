package disk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/anatol/luks.go"
	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/execx/execxtest"
	"github.com/latchkey/latchkey/protocol"
)

// These helpers drive real cryptsetup, blkid and mkfs on real loop
// devices. Everything a test creates (loop devices, mounts) is removed in
// t.Cleanup.

var realRunner = execx.New(execx.Config{Logger: slog.New(slog.DiscardHandler)})

// requireRoot skips tests that need loop devices and mounts.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices, cryptsetup and mounts (run the tests as root)")
	}
	for _, tool := range []string{"losetup", "cryptsetup", "blkid", "mkfs.ext4"} {
		if _, err := realRunner.Run(context.Background(), execx.Cmd{Name: "sh", Args: []string{"-c", "command -v " + tool}}); err != nil {
			t.Skipf("needs %s (apt-get install cryptsetup-bin util-linux e2fsprogs)", tool)
		}
	}
}

func run(t testing.TB, stdin []byte, name string, args ...string) string {
	t.Helper()
	cmd := execx.Cmd{Name: name, Args: args}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	res, err := realRunner.Run(context.Background(), cmd)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return string(res.Stdout)
}

// newLoop creates a zeroed sparse file of size bytes and a loop device
// on it.
func newLoop(t testing.TB, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(run(t, nil, "losetup", "--find", "--show", img))
	t.Cleanup(func() { detachLoop(t, dev) })
	return dev
}

func detachLoop(t testing.TB, dev string) {
	if _, err := realRunner.Run(context.Background(), execx.Cmd{Name: "losetup", Args: []string{"-d", dev}}); err != nil {
		t.Logf("detach %s: %v", dev, err)
	}
}

// writeDev writes through the device node (so the kernel's view of the
// device changes at once) and syncs.
func writeDev(t testing.TB, dev string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readDev(t testing.TB, dev string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// checksum hashes the whole device.
func checksum(t testing.TB, dev string) string {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func testKey(b byte) []byte {
	k := make([]byte, protocol.DiskKeySize)
	for i := range k {
		k[i] = b ^ byte(i*7)
	}
	return k
}

// loopKernel stands in for device-mapper on hosts without it: MapCrypt
// checks the volume and "maps" it as a plaintext loop device over the
// data segment (same offset and size dm-crypt would use), so mkfs, the
// state record and real mounts all behave as they would, minus the
// encryption. Mount and Bind are the real SystemKernel's.
type loopKernel struct {
	t      testing.TB
	mu     sync.Mutex
	maps   map[string]string // mapper name -> loop device
	vols   []luks.Volume
	mounts []string // mount points, in mount order
	failOn string   // make MapCrypt fail with this message (behaviour switch)
}

func newLoopKernel(t testing.TB) *loopKernel {
	k := &loopKernel{t: t, maps: map[string]string{}}
	t.Cleanup(k.powerOff)
	return k
}

func (k *loopKernel) MapCrypt(ctx context.Context, name string, vol *luks.Volume) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failOn != "" {
		return "", errors.New(k.failOn)
	}
	if vol.StorageEncryption != luks2.Cipher || vol.StorageSectorSize != luks2.SectorSize || vol.StorageOffset != luks2.DataOffset {
		return "", fmt.Errorf("loopKernel: unexpected volume %+v", vol)
	}
	k.vols = append(k.vols, *vol)
	if dev, ok := k.maps[name]; ok {
		return dev, nil // adopted, like SystemKernel does within one boot
	}
	backing, err := devnoPath(vol.BackingDevice)
	if err != nil {
		return "", err
	}
	res, err := realRunner.Run(ctx, execx.Cmd{Name: "losetup", Args: []string{"--find", "--show",
		"--offset", fmt.Sprint(vol.StorageOffset), "--sizelimit", fmt.Sprint(vol.StorageSize), backing}})
	if err != nil {
		return "", err
	}
	dev := strings.TrimSpace(string(res.Stdout))
	k.maps[name] = dev
	return dev, nil
}

func (k *loopKernel) Mount(ctx context.Context, source, target, fstype string) error {
	if err := (SystemKernel{}).Mount(ctx, source, target, fstype); err != nil {
		return err
	}
	k.noteMount(target)
	return nil
}

func (k *loopKernel) Bind(ctx context.Context, source, target string) error {
	if err := (SystemKernel{}).Bind(ctx, source, target); err != nil {
		return err
	}
	k.noteMount(target)
	return nil
}

func (k *loopKernel) noteMount(target string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, m := range k.mounts {
		if m == target {
			return
		}
	}
	k.mounts = append(k.mounts, target)
}

// powerOff unmounts everything and drops the mappings, as a reboot does.
func (k *loopKernel) powerOff() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := len(k.mounts) - 1; i >= 0; i-- {
		for unix.Unmount(k.mounts[i], 0) == nil {
		}
	}
	k.mounts = nil
	for name, dev := range k.maps {
		detachLoop(k.t, dev)
		delete(k.maps, name)
	}
}

func (k *loopKernel) mapped() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.vols)
}

// devnoPath turns "major:minor" into /dev/<name>.
func devnoPath(devno string) (string, error) {
	b, err := os.ReadFile("/sys/dev/block/" + devno + "/uevent")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			return "/dev/" + name, nil
		}
	}
	return "", fmt.Errorf("no DEVNAME for %s", devno)
}

// testRig is one state disk with everything a stage needs.
type testRig struct {
	t      testing.TB
	dev    string
	root   string // holds the mount point and bind targets
	kernel *loopKernel
	logs   *bytes.Buffer
	rec    *execxtest.Fake
}

func newRig(t testing.TB, size int64) *testRig {
	requireRoot(t)
	r := &testRig{t: t, dev: newLoop(t, size), root: t.TempDir(), logs: &bytes.Buffer{}}
	r.kernel = newLoopKernel(t)
	return r
}

// config is a stage config for the rig: loop kernel, binds inside root,
// a recording runner over the real one, a JSON log into r.logs.
func (r *testRig) config() LUKSConfig {
	log := slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.rec = &execxtest.Fake{Next: execx.New(execx.Config{Logger: log})}
	return LUKSConfig{
		Device:     r.dev,
		MountPoint: filepath.Join(r.root, "state"),
		BindMounts: []string{filepath.Join(r.root, "etc/kubernetes"), filepath.Join(r.root, "var/lib/kubelet")},
		CredentialFiles: []string{filepath.Join(r.root, "etc/kubernetes/kubelet.conf"),
			filepath.Join(r.root, "var/lib/kubelet/pki/kubelet-client-current.pem")},
		Runner: r.rec,
		Kernel: r.kernel,
		Logger: log,
	}
}

func (r *testRig) stage(mod func(*LUKSConfig)) *LUKS {
	r.t.Helper()
	cfg := r.config()
	if mod != nil {
		mod(&cfg)
	}
	l, err := NewLUKS(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return l
}

// boot runs Prepare and Open like the agent does.
func (r *testRig) boot(l *LUKS, key []byte) (Plan, Result, error) {
	ctx := context.Background()
	plan, err := l.Prepare(ctx)
	if err != nil {
		return plan, Result{}, err
	}
	res, err := l.Open(ctx, plan, Keys{Current: key})
	return plan, res, err
}

func (r *testRig) mustBoot(l *LUKS, key []byte) (Plan, Result) {
	r.t.Helper()
	plan, res, err := r.boot(l, key)
	if err != nil {
		r.t.Fatalf("boot: %v", err)
	}
	return plan, res
}

// cString is a NUL-terminated field as text.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
