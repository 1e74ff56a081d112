package disk

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPartitionLocksTheWholeDisk: a state disk on a partition locks its
// parent disk, so an exclusive lock another tool (udev, sfdisk --lock,
// another agent) holds on the disk keeps the agent out until it is let go.
func TestPartitionLocksTheWholeDisk(t *testing.T) {
	r := newRig(t, 128*mib)
	img := filepath.Join(t.TempDir(), "partitioned.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 128*mib); err != nil {
		t.Fatal(err)
	}
	run(t, nil, "sgdisk", "-o", "-n", "1:2048:+64M", img)
	disk := strings.TrimSpace(run(t, nil, "losetup", "--find", "--show", "--partscan", img))
	t.Cleanup(func() { detachLoop(t, disk) })
	part := disk + "p1"
	var st unix.Stat_t
	for i := 0; unix.Stat(part, &st) != nil; i++ {
		if i == 50 {
			t.Skipf("the kernel made no %s (no partition scanning here)", part)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := wholeDisk(st.Rdev); err != nil || got != disk {
		t.Fatalf("wholeDisk(%s) = %q, %v; want %s", part, got, err, disk)
	}

	checkLockKeepsOut(t, r, disk, part)
}

// TestLockedDiskKeepsAgentOut: the same on a whole disk, which runs on
// every kernel.
func TestLockedDiskKeepsAgentOut(t *testing.T) {
	r := newRig(t, testDiskSize)
	checkLockKeepsOut(t, r, r.dev, r.dev)
}

// checkLockKeepsOut holds LOCK_EX on disk and checks a stage on device
// waits, refuses naming the lock, writes nothing, and goes on once the
// lock is let go.
func checkLockKeepsOut(t *testing.T, r *testRig, disk, device string) {
	t.Helper()
	holder, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	before := checksum(t, device)
	l := r.stage(func(c *LUKSConfig) {
		c.Device, c.LockTimeout, c.PollInterval = device, 300*time.Millisecond, 20*time.Millisecond
	})
	_, err = l.Prepare(context.Background())
	if err == nil || !strings.Contains(err.Error(), "state disk "+disk+" is locked by another process") {
		t.Fatalf("Prepare with the disk locked: %v", err)
	}
	_, err = l.Open(context.Background(), Plan{UUID: newUUID()}, Keys{Current: testKey(3)})
	if err == nil || !strings.Contains(err.Error(), "is locked by another process") || r.rec.Ran("cryptsetup") != 0 {
		t.Fatalf("Open with the disk locked: %v", err)
	}
	if checksum(t, device) != before {
		t.Fatal("device changed while locked")
	}
	unix.Flock(int(holder.Fd()), unix.LOCK_UN)
	plan, res := r.mustBoot(l, testKey(3))
	if plan.Rejoin || !res.Formatted {
		t.Fatalf("boot after the lock was let go: %+v, %+v", plan, res)
	}
}

// TestWholeDiskFromSysfs resolves a partition to its disk through a copy
// of the sysfs layout (/sys/dev/block/M:m -> .../block/<disk>/<part>,
// with a "partition" attribute), for kernels where the test above cannot
// make partitions.
func TestWholeDiskFromSysfs(t *testing.T) {
	root := t.TempDir()
	disk := filepath.Join(root, "devices/pci0000:00/virtio5/block/vdz")
	part := filepath.Join(disk, "vdz1")
	for dir, uevent := range map[string]string{disk: "MAJOR=254\nMINOR=16\nDEVNAME=vdz\nDEVTYPE=disk\n", part: "MAJOR=254\nMINOR=17\nDEVNAME=vdz1\nDEVTYPE=partition\n"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "uevent"), []byte(uevent), 0o644)
	}
	os.WriteFile(filepath.Join(part, "partition"), []byte("1\n"), 0o644)
	os.MkdirAll(filepath.Join(root, "dev/block"), 0o755)
	os.Symlink(disk, filepath.Join(root, "dev/block/254:16"))
	os.Symlink(part, filepath.Join(root, "dev/block/254:17"))
	old := sysBlock
	sysBlock = filepath.Join(root, "dev/block")
	defer func() { sysBlock = old }()
	for minor, want := range map[uint32]string{16: "/dev/vdz", 17: "/dev/vdz"} {
		if got, err := wholeDisk(unix.Mkdev(254, minor)); err != nil || got != want {
			t.Errorf("wholeDisk(254:%d) = %q, %v; want %s", minor, got, err, want)
		}
	}
	if _, err := wholeDisk(unix.Mkdev(254, 99)); err == nil {
		t.Error("an unknown device resolved")
	}
}
