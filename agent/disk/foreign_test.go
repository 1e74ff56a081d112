package disk

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/execx"
)

// foreignCase puts something on a device that latchkey must not format.
type foreignCase struct {
	name  string
	size  int64
	make  func(t *testing.T, dev string)
	found string // must appear in the refusal
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

var foreignCases = []foreignCase{
	{"ext4", testDiskSize, func(t *testing.T, dev string) { run(t, nil, "mkfs.ext4", "-q", "-F", dev) }, "ext4 (filesystem)"},
	{"xfs", 320 << 20, func(t *testing.T, dev string) { run(t, nil, "mkfs.xfs", "-q", "-f", dev) }, "xfs (filesystem)"},
	{"gpt", testDiskSize, func(t *testing.T, dev string) { run(t, nil, "sgdisk", "-o", "-n", "1:0:0", dev) }, "gpt partition table"},
	{"lvm", testDiskSize, func(t *testing.T, dev string) {
		if _, err := realRunner.Run(context.Background(), execx.Cmd{Name: "pvcreate", Args: []string{"-ff", "-y", dev}}); err != nil {
			t.Skipf("pvcreate does not work on a loop device here: %v", err)
		}
	}, "LVM2_member"},
	{"luks1", testDiskSize, func(t *testing.T, dev string) {
		run(t, testKey(9), "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks1",
			"--pbkdf-force-iterations", "1000", "--key-file", "-", dev)
	}, "LUKS1 header"},
	{"swap", testDiskSize, func(t *testing.T, dev string) { run(t, nil, "mkswap", dev) }, "swap"},
	{"random data", testDiskSize, func(t *testing.T, dev string) { writeDev(t, dev, 0, randomBytes(mib)) }, "unrecognised non-zero data at byte 0"},
	{"data in the middle of the first MiB", testDiskSize, func(t *testing.T, dev string) {
		writeDev(t, dev, 300<<10, randomBytes(4096))
	}, "unrecognised non-zero data at byte 307200"},
	{"data in the last MiB only", testDiskSize, func(t *testing.T, dev string) {
		writeDev(t, dev, testDiskSize-4096, randomBytes(4096))
	}, "unrecognised non-zero data at byte 67104768"},
}

func TestForeignDevicesRefusedAndUnchanged(t *testing.T) {
	requireRoot(t)
	for _, c := range foreignCases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.size)
			c.make(t, r.dev)
			before := checksum(t, r.dev)
			l := r.stage(nil)

			_, err := l.Prepare(context.Background())
			if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), c.found) {
				t.Fatalf("Prepare: %v; want ErrForeignData naming %q", err, c.found)
			}
			// Open with a first-boot plan (an agent that skipped Prepare,
			// or a disk swapped after it) refuses just the same.
			_, err = l.Open(context.Background(), Plan{UUID: newUUID()}, testKey(1))
			if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), c.found) {
				t.Fatalf("Open: %v; want ErrForeignData naming %q", err, c.found)
			}
			if r.rec.Ran("cryptsetup luksFormat")+r.rec.Ran("mkfs") != 0 || r.kernel.mapped() != 0 {
				t.Fatal("formatted or mapped a foreign device")
			}
			if after := checksum(t, r.dev); after != before {
				t.Fatal("device changed")
			}
			t.Logf("refusal: %v", err)
		})
	}
}

func TestWipeStateDiskOverridesForeignData(t *testing.T) {
	r := newRig(t, testDiskSize)
	run(t, nil, "sgdisk", "-o", "-n", "1:0:0", r.dev) // GPT with a backup at the end
	l := r.stage(func(c *LUKSConfig) { c.WipeStateDisk = true })
	plan, res := r.mustBoot(l, testKey(7))
	if plan.Rejoin || !res.Formatted || !res.MadeFileSystem {
		t.Fatalf("wipe boot: plan %+v, result %+v", plan, res)
	}
	if !allZero(readDev(t, r.dev, testDiskSize-mib, mib)) {
		t.Fatal("the backup GPT at the end survived the wipe")
	}
	if !strings.Contains(r.logs.String(), "WipeStateDisk set") {
		t.Fatal("wipe not logged")
	}
	r.kernel.powerOff()

	// The switch left on never wipes latchkey's own disk.
	header := readDev(t, r.dev, 0, DataOffset)
	plan2, res2 := r.mustBoot(r.stage(func(c *LUKSConfig) { c.WipeStateDisk = true }), testKey(7))
	if !plan2.Rejoin || plan2.UUID != plan.UUID || res2.Formatted || res2.MadeFileSystem {
		t.Fatalf("reboot with the switch on: plan %+v, result %+v", plan2, res2)
	}
	if string(readDev(t, r.dev, 0, DataOffset)) != string(header) {
		t.Fatal("header rewritten")
	}
}
