package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"golang.org/x/sys/unix"
)

// fakeSerial gives dev a serial in a test copy of the udev database, as
// udev would for a real disk (loop devices have none).
func fakeSerial(t *testing.T, dev string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	serial := "latchkey-test-" + newUUID()[:8]
	name := fmt.Sprintf("b%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if err := os.WriteFile(filepath.Join(dir, name), []byte("S:disk/by-id/x\nE:ID_SERIAL="+serial+"\nE:ID_TYPE=disk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := udevDataDir
	udevDataDir = dir
	t.Cleanup(func() { udevDataDir = old })
	return serial
}

func TestWipeStateDiskOverridesForeignData(t *testing.T) {
	r := newRig(t, testDiskSize)
	serial := fakeSerial(t, r.dev)
	run(t, nil, "sgdisk", "-o", "-n", "1:0:0", r.dev) // GPT with a backup at the end
	before := checksum(t, r.dev)

	// Refused, and the refusal says what to set.
	_, err := r.stage(nil).Prepare(context.Background())
	if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), `set wipeStateDisk to "`+serial+`" (this disk's serial)`) {
		t.Fatalf("Prepare: %v", err)
	}
	// A wipe naming another disk destroys nothing.
	other := r.stage(func(c *LUKSConfig) { c.WipeStateDisk = "some-other-disk" })
	for _, step := range []string{"Prepare", "Open"} {
		var err error
		if step == "Prepare" {
			_, err = other.Prepare(context.Background())
		} else {
			_, err = other.Open(context.Background(), Plan{UUID: newUUID()}, Keys{Current: testKey(7)})
		}
		if !errors.Is(err, ErrWipeMismatch) || !errors.Is(err, ErrForeignData) ||
			!strings.Contains(err.Error(), `wipeStateDisk is "some-other-disk", which does not name this disk`) ||
			!strings.Contains(err.Error(), `serial "`+serial+`"`) || !strings.Contains(err.Error(), "nothing destroyed") {
			t.Fatalf("%s with a wipe naming another disk: %v", step, err)
		}
	}
	if checksum(t, r.dev) != before || r.rec.Ran("cryptsetup luksFormat") != 0 {
		t.Fatal("a wipe naming another disk changed the device")
	}

	l := r.stage(func(c *LUKSConfig) { c.WipeStateDisk = serial })
	plan, res := r.mustBoot(l, testKey(7))
	if plan.Rejoin || !res.Formatted || !res.MadeFileSystem {
		t.Fatalf("wipe boot: plan %+v, result %+v", plan, res)
	}
	if !allZero(readDev(t, r.dev, testDiskSize-tailScanLength, tailScanLength)) {
		t.Fatal("the backup GPT at the end survived the wipe")
	}
	if !strings.Contains(r.logs.String(), "wipeStateDisk names this disk; destroying what it holds") {
		t.Fatal("wipe not logged")
	}
	r.kernel.powerOff()

	// The setting left on never wipes latchkey's own disk.
	header := readDev(t, r.dev, 0, luks2.DataOffset)
	plan2, res2 := r.mustBoot(r.stage(func(c *LUKSConfig) { c.WipeStateDisk = serial }), testKey(7))
	if !plan2.Rejoin || plan2.UUID != plan.UUID || res2.Formatted || res2.MadeFileSystem {
		t.Fatalf("reboot with the setting on: plan %+v, result %+v", plan2, res2)
	}
	if string(readDev(t, r.dev, 0, luks2.DataOffset)) != string(header) {
		t.Fatal("header rewritten")
	}
}

// TestWipeStateDiskByIDAndLUKSUUID: the other two ways to name a disk.
// A LUKS1 disk's refusal offers its LUKS UUID; a by-id link (in a test
// copy of /dev/disk/by-id) that resolves to the device names it too,
// while one resolving to another device does not.
func TestWipeStateDiskByIDAndLUKSUUID(t *testing.T) {
	r := newRig(t, testDiskSize)
	other := newLoop(t, testDiskSize)
	run(t, testKey(9), "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks1", "--pbkdf-force-iterations", "1000", "--key-file", "-", r.dev)
	uuid := strings.TrimSpace(run(t, nil, "cryptsetup", "luksUUID", r.dev))
	dir := t.TempDir()
	old := byIDDir
	byIDDir = dir
	defer func() { byIDDir = old }()
	os.Symlink(r.dev, filepath.Join(dir, "virtio-state-disk"))
	os.Symlink(other, filepath.Join(dir, "virtio-other-disk"))

	_, err := r.stage(nil).Prepare(context.Background())
	if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), "a LUKS1 header at byte 0") ||
		!strings.Contains(err.Error(), `set wipeStateDisk to "`+filepath.Join(dir, "virtio-state-disk")+`" (this disk's by-id name)`) {
		t.Fatalf("Prepare: %v", err)
	}
	before := checksum(t, r.dev)
	_, err = r.stage(func(c *LUKSConfig) { c.WipeStateDisk = filepath.Join(dir, "virtio-other-disk") }).Prepare(context.Background())
	if !errors.Is(err, ErrWipeMismatch) || !strings.Contains(err.Error(), "LUKS UUID "+uuid) {
		t.Fatalf("a by-id name of another disk: %v", err)
	}
	if checksum(t, r.dev) != before {
		t.Fatal("device changed")
	}
	for _, name := range []string{uuid, filepath.Join(dir, "virtio-state-disk")} {
		r.kernel.powerOff()
		writeDev(t, r.dev, 0, make([]byte, luks2.DataOffset)) // back to the LUKS1 disk for the second name
		run(t, testKey(9), "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks1", "--uuid", uuid, "--pbkdf-force-iterations", "1000", "--key-file", "-", r.dev)
		plan, res := r.mustBoot(r.stage(func(c *LUKSConfig) { c.WipeStateDisk = name }), testKey(8))
		if plan.Rejoin || !res.Formatted {
			t.Fatalf("wipe naming %s: plan %+v, result %+v", name, plan, res)
		}
	}
}
