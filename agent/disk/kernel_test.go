package disk

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anatol/luks.go"
	"golang.org/x/sys/unix"
)

// requireDeviceMapper skips where the kernel cannot map (this build host
// has no dm_mod); the QEMU end-to-end guest runs these.
func requireDeviceMapper(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if ok, why := HasDeviceMapper(); !ok {
		t.Skipf("dm-crypt mapping, mkfs inside the volume and mount need device-mapper: %s; runs in the QEMU guest (scripts/vm)", why)
	}
}

// TestSystemKernelMapsAndMounts runs the whole stage with the real
// kernel: luks.go maps the volume, the file system is made inside it and
// mounted, the data on the raw device is ciphertext, cryptsetup's own
// activation sees the same file system, and a reboot (mapping removed)
// and an agent restart (mapping kept) both come back to it.
func TestSystemKernelMapsAndMounts(t *testing.T) {
	requireDeviceMapper(t)
	r := newRig(t, testDiskSize)
	name := fmt.Sprintf("latchkey-test-%d", os.Getpid())
	cfg := func(c *LUKSConfig) { c.Kernel, c.MapperName = SystemKernel{}, name }
	key := testKey(31)
	t.Cleanup(func() { teardown(t, r, name) })

	_, res := r.mustBoot(r.stage(cfg), key)
	if filepath.Dir(res.Device) != "/dev" || !res.MadeFileSystem {
		t.Fatalf("result = %+v", res)
	}
	secret := []byte("latchkey-plaintext-canary-0123456789")
	canary := filepath.Join(r.root, "etc/kubernetes/canary")
	if err := os.WriteFile(canary, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	unix.Sync()

	// Agent restart: mapping and mounts adopted.
	_, res2 := r.mustBoot(r.stage(cfg), key)
	if res2.Device != res.Device || res2.MadeFileSystem {
		t.Fatalf("restart result = %+v", res2)
	}
	teardown(t, r, name)
	if raw := readDev(t, r.dev, 0, testDiskSize); bytes.Contains(raw, secret) {
		t.Fatal("plaintext on the raw device")
	}
	// On the state file system the bind source is MountPoint/<target>.
	checkCryptsetupSeesFile(t, r.dev, key, canary, secret)

	_, res3 := r.mustBoot(r.stage(cfg), key)
	if res3.MadeFileSystem || res3.Formatted {
		t.Fatalf("reboot result = %+v", res3)
	}
	if b, err := os.ReadFile(canary); err != nil || !bytes.Equal(b, secret) {
		t.Fatalf("after reboot: %q, %v", b, err)
	}
}

// checkCryptsetupSeesFile opens the disk with cryptsetup (not luks.go)
// and reads a file from the state file system.
func checkCryptsetupSeesFile(t *testing.T, dev string, key []byte, rel string, want []byte) {
	t.Helper()
	name := fmt.Sprintf("latchkey-cmp-%d", os.Getpid())
	run(t, key, "cryptsetup", "open", "--readonly", "--key-file", "-", dev, name)
	defer run(t, nil, "cryptsetup", "close", name)
	mnt := t.TempDir()
	if err := unix.Mount("/dev/mapper/"+name, mnt, "ext4", unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, 0)
	if b, err := os.ReadFile(filepath.Join(mnt, rel)); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("cryptsetup's view of %s: %q, %v", rel, b, err)
	}
}

// teardown unmounts and removes the mapping, as a shutdown does.
func teardown(t *testing.T, r *testRig, name string) {
	r.kernel.powerOff()
	for _, target := range []string{filepath.Join(r.root, "etc/kubernetes"), filepath.Join(r.root, "var/lib/kubelet"), filepath.Join(r.root, "state")} {
		for unix.Unmount(target, 0) == nil {
		}
	}
	if err := luks.Lock(name); err != nil {
		t.Logf("remove mapping %s: %v", name, err)
	}
}

func TestSystemKernelWithoutDeviceMapper(t *testing.T) {
	if ok, _ := HasDeviceMapper(); ok {
		t.Skip("this kernel has device-mapper")
	}
	_, err := SystemKernel{}.MapCrypt(context.Background(), "x", &luks.Volume{})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("device-mapper")) {
		t.Fatalf("MapCrypt without dm = %v", err)
	}
}

// HasDeviceMapper reports whether the running kernel offers
// device-mapper, with the reason if not. Opening /dev/mapper/control
// first lets the kernel autoload dm_mod (systemd creates that node
// statically for exactly this).
func HasDeviceMapper() (bool, string) {
	if f, err := os.Open("/dev/mapper/control"); err == nil {
		f.Close()
	}
	b, err := os.ReadFile("/proc/misc")
	if err != nil {
		return false, fmt.Sprintf("cannot read /proc/misc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "device-mapper" {
			return true, ""
		}
	}
	return false, "no device-mapper in /proc/misc (dm_mod not built or loaded)"
}
