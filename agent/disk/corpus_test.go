package disk

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/execx"
)

// The foreign-device corpus: every way a disk gets "reused" that the
// blank-device check must catch (docs/disk.md, "The blank-device rule").
// Each case builds the device with the real tools, records its sha256,
// runs the real first-boot path (Prepare, and Open with a first-boot
// plan as an agent that skipped Prepare would), and checks that both
// refuse naming what was found and where, and that the device is
// unchanged byte for byte.

// corpusCase puts something on a device that latchkey must not format.
type corpusCase struct {
	name  string
	size  int64
	make  func(t *testing.T, dev string, size int64)
	found string // must appear in the refusal
}

// foundFull is what the full check's refusal names instead of found,
// where it differs: it reads every byte, so it finds what lies first.
var foundFull = map[string]string{
	"gpt, wipefs -a, xfs partition left":  "the remains of an MBR partition table (first non-zero byte at byte 448; its 0x55AA signature was erased)",
	"mbr, wipefs -a, ext4 partition left": "the remains of an MBR partition table (first non-zero byte at byte 44",
}

// atOffset runs fn on a loop device over dev[off, off+size), so real mkfs
// tools write their file system at off with dev's zeros before it.
func atOffset(t *testing.T, dev string, off, size int64, fn func(sub string)) {
	t.Helper()
	sub := strings.TrimSpace(run(t, nil, "losetup", "--find", "--show", "--offset", fmt.Sprint(off), "--sizelimit", fmt.Sprint(size), dev))
	defer detachLoop(t, sub)
	fn(sub)
	run(t, nil, "sync")
}

func needTool(t *testing.T, tool, pkg string) {
	t.Helper()
	if _, err := realRunner.Run(context.Background(), execx.Cmd{Name: "sh", Args: []string{"-c", "command -v " + tool}}); err != nil {
		t.Skipf("needs %s (apt-get install %s)", tool, pkg)
	}
}

// fileSystems are made at offsets 0, 1 MiB and 64 MiB.
var fileSystems = []struct {
	name, tool, pkg string
	size            int64 // of the file system
	mkfs            func(t *testing.T, sub string)
	found           string
}{
	{"ext4", "mkfs.ext4", "e2fsprogs", 32 * mib, func(t *testing.T, sub string) { run(t, nil, "mkfs.ext4", "-q", "-F", "-E", "nodiscard", sub) }, "an ext2/3/4 file system"},
	{"xfs", "mkfs.xfs", "xfsprogs", 300 * mib, func(t *testing.T, sub string) { run(t, nil, "mkfs.xfs", "-q", "-f", "-K", sub) }, "an xfs file system"},
	{"btrfs", "mkfs.btrfs", "btrfs-progs", 128 * mib, func(t *testing.T, sub string) { run(t, nil, "mkfs.btrfs", "-q", "-f", "-K", sub) }, "a btrfs file system"},
	{"vfat", "mkfs.vfat", "dosfstools", 32 * mib, func(t *testing.T, sub string) { run(t, nil, "mkfs.vfat", sub) }, "a FAT (vfat) file system"},
	{"swap", "mkswap", "util-linux", 32 * mib, func(t *testing.T, sub string) { run(t, nil, "mkswap", sub) }, "a swap area"},
	{"iso9660", "xorriso", "xorriso", 4 * mib, func(t *testing.T, sub string) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "README"), []byte("a small ISO 9660 image"), 0o644)
		iso := filepath.Join(t.TempDir(), "small.iso")
		run(t, nil, "xorriso", "-as", "mkisofs", "-quiet", "-o", iso, dir)
		b, err := os.ReadFile(iso)
		if err != nil {
			t.Fatal(err)
		}
		writeDev(t, sub, 0, b)
	}, "an ISO 9660 image"},
}

func corpus() []corpusCase {
	var cases []corpusCase
	for _, fs := range fileSystems {
		for _, off := range []int64{0, mib, 64 * mib} {
			size := max(128*mib, off+fs.size+8*mib)
			cases = append(cases, corpusCase{
				name: fmt.Sprintf("%s at %d MiB", fs.name, off/mib), size: size,
				make: func(t *testing.T, dev string, _ int64) {
					needTool(t, fs.tool, fs.pkg)
					atOffset(t, dev, off, fs.size, func(sub string) { fs.mkfs(t, sub) })
				},
				found: fmt.Sprintf("%s at %s", fs.found, at(off)),
			})
		}
	}
	return append(cases, []corpusCase{
		{"gpt, sgdisk --zap-all, ext4 partition left", 128 * mib, func(t *testing.T, dev string, _ int64) {
			run(t, nil, "sgdisk", "-o", "-n", "1:2048:+64M", dev)
			atOffset(t, dev, mib, 64*mib, func(sub string) { run(t, nil, "mkfs.ext4", "-q", "-F", "-E", "nodiscard", sub) })
			run(t, nil, "sgdisk", "--zap-all", dev)
		}, "an ext2/3/4 file system at byte 1048576 (1 MiB)"},
		{"gpt, wipefs -a, xfs partition left", 512 * mib, func(t *testing.T, dev string, _ int64) {
			run(t, nil, "sgdisk", "-o", "-n", "1:2048:+320M", dev)
			atOffset(t, dev, mib, 320*mib, func(sub string) { run(t, nil, "mkfs.xfs", "-q", "-f", "-K", sub) })
			run(t, nil, "wipefs", "-a", dev)
		}, "an xfs file system at byte 1048576 (1 MiB)"},
		{"mbr, wipefs -a, ext4 partition left", 128 * mib, func(t *testing.T, dev string, _ int64) {
			run(t, []byte("label: dos\nstart=2048, size=131072, type=83\n"), "sfdisk", "-q", dev)
			atOffset(t, dev, mib, 64*mib, func(sub string) { run(t, nil, "mkfs.ext4", "-q", "-F", "-E", "nodiscard", sub) })
			run(t, nil, "wipefs", "-a", dev)
		}, "an ext2/3/4 file system at byte 1048576 (1 MiB)"},
		{"mbr, sgdisk --zap-all, vfat partition left", 128 * mib, func(t *testing.T, dev string, _ int64) {
			needTool(t, "mkfs.vfat", "dosfstools")
			run(t, []byte("label: dos\nstart=4096, size=65536, type=c\n"), "sfdisk", "-q", dev)
			atOffset(t, dev, 2*mib, 32*mib, func(sub string) { run(t, nil, "mkfs.vfat", sub) })
			run(t, nil, "sgdisk", "--zap-all", dev)
		}, "a FAT (vfat) file system at byte 2097152 (2 MiB)"},
		{"md 1.0 superblock at the end", 128 * mib, func(t *testing.T, dev string, size int64) {
			off := (size - 8192) &^ 4095
			writeDev(t, dev, off, mdSuperblock1(off/512))
			checkBlkidSees(t, dev, "linux_raid_member")
		}, fmt.Sprintf("an md RAID superblock (version 1.0) at byte %d", (128*mib-8192)&^4095)},
		{"md 0.90 superblock at the end", 128 * mib, func(t *testing.T, dev string, size int64) {
			writeDev(t, dev, size&^65535-65536, mdSuperblock090())
			checkBlkidSees(t, dev, "linux_raid_member")
		}, fmt.Sprintf("an md RAID superblock (version 0.90) at byte %d", 128*mib-65536)},
		{"LVM PV at 1 MiB", 128 * mib, func(t *testing.T, dev string, _ int64) {
			atOffset(t, dev, mib, 64*mib, func(sub string) {
				if _, err := realRunner.Run(context.Background(), execx.Cmd{Name: "pvcreate", Args: []string{"-ff", "-y", "--devices", sub, sub}}); err != nil {
					t.Skipf("pvcreate does not work on a loop device here: %v", err)
				}
			})
		}, "an LVM physical volume at byte 1048576 (1 MiB)"},
		{"LUKS1 header at 1 MiB", 128 * mib, func(t *testing.T, dev string, _ int64) {
			atOffset(t, dev, mib, 64*mib, func(sub string) {
				run(t, testKey(9), "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks1", "--pbkdf-force-iterations", "1000", "--key-file", "-", sub)
			})
		}, "a LUKS1 header at byte 1048576 (1 MiB)"},
		{"LUKS2 header at 1 MiB", 128 * mib, func(t *testing.T, dev string, _ int64) {
			atOffset(t, dev, mib, 64*mib, func(sub string) {
				run(t, testKey(9), "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file", "-", sub)
			})
		}, "a LUKS2 header at byte 1048576 (1 MiB)"},
		{"LUKS1 header at 0", 128 * mib, func(t *testing.T, dev string, _ int64) {
			run(t, testKey(9), "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks1", "--pbkdf-force-iterations", "1000", "--key-file", "-", dev)
		}, "a LUKS1 header at byte 0"},
		{"1 MiB random at 0", 128 * mib, func(t *testing.T, dev string, _ int64) { writeDev(t, dev, 0, randomNoMagic(mib)) },
			"unrecognised non-zero data at byte 0"},
		{"1 MiB random at 64 MiB", 128 * mib, func(t *testing.T, dev string, _ int64) { writeDev(t, dev, 64*mib, randomNoMagic(mib)) },
			"unrecognised non-zero data at byte 67108864 (64 MiB)"},
		{"1 MiB random in the last 4 MiB", 128 * mib, func(t *testing.T, dev string, size int64) {
			writeDev(t, dev, size-3*mib-4096, randomNoMagic(mib))
		}, fmt.Sprintf("unrecognised non-zero data at byte %d", 128*mib-3*mib-4096)},
		{"4 KiB in the middle of the first MiB", 128 * mib, func(t *testing.T, dev string, _ int64) { writeDev(t, dev, 300<<10, randomNoMagic(4096)) },
			"unrecognised non-zero data at byte 307200"},
		{"1 byte in the header area after the first MiB", 128 * mib, func(t *testing.T, dev string, _ int64) {
			writeDev(t, dev, 9*mib+12345, []byte{1})
		}, fmt.Sprintf("unrecognised non-zero data at byte %d", 9*mib+12345)},
		{"a sample hit in the middle of the device", 512 * mib, func(t *testing.T, dev string, _ int64) {
			writeDev(t, dev, 200*mib+100, []byte("x"))
		}, fmt.Sprintf("unrecognised non-zero data at byte %d", 200*mib+100)},
	}...)
}

// randomNoMagic is random data that starts non-zero and carries none of
// the table's 2-byte magics where they would be read (so the case is
// deterministic).
func randomNoMagic(n int) []byte {
	b := randomBytes(n)
	b[0] = 0xa5
	for _, i := range []int{510, 511, 1080, 1081} {
		if i < n {
			b[i] = 0
		}
	}
	return b
}

// mdSuperblock1 is an md RAID v1.x superblock (struct mdp_superblock_1,
// drivers/md/md.h: magic, major version 1, set UUID and name, level 1, 2
// raid disks, super_offset in sectors, one dev_roles entry, and sb_csum
// computed as the kernel's calc_sb_1_csum does), crafted byte for byte
// because this kernel has no md driver for mdadm --create. libblkid
// checks the same fields, so blkid must see it (checkBlkidSees).
func mdSuperblock1(superOffsetSectors int64) []byte {
	const maxDev = 2
	sb := make([]byte, 4096)
	le := binary.LittleEndian
	le.PutUint32(sb[0:], mdMagic)
	le.PutUint32(sb[4:], 1)                            // major_version
	copy(sb[16:32], "latchkey-md-uuid")                // set_uuid
	copy(sb[32:64], "corpus:0")                        // set_name
	le.PutUint64(sb[64:], 1700000000)                  // ctime
	le.PutUint32(sb[72:], 1)                           // level: raid1
	le.PutUint64(sb[80:], 100000)                      // size
	le.PutUint32(sb[92:], 2)                           // raid_disks
	le.PutUint64(sb[136:], 100000)                     // data_size
	le.PutUint64(sb[144:], uint64(superOffsetSectors)) // super_offset
	copy(sb[168:184], "latchkey-dev-uid")              // device_uuid
	le.PutUint64(sb[192:], 1700000000)                 // utime
	le.PutUint64(sb[200:], 1)                          // events
	le.PutUint32(sb[220:], maxDev)                     // max_dev
	le.PutUint16(sb[256:], 0)                          // dev_roles[0]
	le.PutUint16(sb[258:], 1)                          // dev_roles[1]
	var sum uint64
	for i := 0; i < 256+2*maxDev; i += 4 {
		sum += uint64(le.Uint32(sb[i:]))
	}
	le.PutUint32(sb[216:], uint32(sum&0xffffffff+sum>>32)) // sb_csum
	return sb
}

// mdSuperblock090 is an md RAID 0.90 superblock (mdp_super_t, 4 KiB,
// host-endian: little-endian here): magic, version 0.90.0, set UUID,
// level 1, 2 disks, and the checksum over the 4 KiB (calc_sb_csum).
func mdSuperblock090() []byte {
	sb := make([]byte, 4096)
	le := binary.LittleEndian
	w := func(word int, v uint32) { le.PutUint32(sb[4*word:], v) }
	w(0, mdMagic)
	w(1, 0)  // major_version
	w(2, 90) // minor_version
	w(5, 0x1234)
	w(6, 1700000000) // ctime
	w(7, 1)          // level
	w(8, 100000)     // size
	w(9, 2)          // nr_disks
	w(10, 2)         // raid_disks
	w(13, 0x5678)    // set_uuid1..3
	w(14, 0x9abc)
	w(15, 0xdef0)
	var sum uint64
	for i := 0; i < 4096; i += 4 {
		sum += uint64(le.Uint32(sb[i:]))
	}
	w(38, uint32(sum&0xffffffff+sum>>32)) // sb_csum
	return sb
}

// checkBlkidSees checks libblkid, and mdadm's own parser (which needs no
// md driver to read a superblock), recognise the crafted superblock.
func checkBlkidSees(t *testing.T, dev, typ string) {
	t.Helper()
	res, _ := realRunner.Run(context.Background(), execx.Cmd{Name: "blkid", Args: []string{"-p", "-o", "export", dev}})
	if !strings.Contains(string(res.Stdout), "TYPE="+typ) {
		t.Fatalf("the crafted superblock is not what libblkid recognises (blkid -p says %q)", res.Stdout)
	}
	needTool(t, "mdadm", "mdadm")
	out := run(t, nil, "mdadm", "--examine", dev)
	if !strings.Contains(out, "Magic : a92b4efc") || !strings.Contains(out, "Raid Level : raid1") || !strings.Contains(out, "- correct") {
		t.Fatalf("mdadm --examine does not accept the crafted superblock:\n%s", out)
	}
}

func TestForeignDevicesRefusedAndUnchanged(t *testing.T) {
	requireRoot(t)
	for _, c := range corpus() {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.size)
			c.make(t, r.dev, c.size)
			before := checksum(t, r.dev)
			for _, rule := range []string{BlankCheckFull, BlankCheckSampled} {
				found := c.found
				if f, ok := foundFull[c.name]; ok && rule == BlankCheckFull {
					found = f
				}
				l := r.stage(func(cfg *LUKSConfig) { cfg.BlankCheck = rule })
				_, err := l.Prepare(context.Background())
				if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), found) {
					t.Fatalf("%s: Prepare: %v\nwant ErrForeignData naming %q", rule, err, found)
				}
				// Open with a first-boot plan (an agent that skipped Prepare,
				// or a disk swapped after it) refuses just the same.
				_, err = l.Open(context.Background(), Plan{UUID: newUUID()}, Keys{Current: testKey(1)})
				if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), found) {
					t.Fatalf("%s: Open: %v\nwant ErrForeignData naming %q", rule, err, found)
				}
				if r.rec.Ran("cryptsetup luksFormat")+r.rec.Ran("mkfs") != 0 || r.kernel.mapped() != 0 {
					t.Fatal("formatted or mapped a foreign device")
				}
				t.Logf("%s refusal: %v", rule, err)
			}
			if after := checksum(t, r.dev); after != before {
				t.Fatal("device changed")
			}
		})
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// sampled selects the sampled blank-device rule.
func sampled(c *LUKSConfig) { c.BlankCheck = BlankCheckSampled }

// TestPreadFallbackSeesTheSame: with Linux AIO unavailable the sampled
// scan falls back to blocking preads, which must find the same things.
func TestPreadFallbackSeesTheSame(t *testing.T) {
	requireRoot(t)
	useAIO = false
	defer func() { useAIO = true }()
	for _, c := range corpus() {
		if !strings.Contains(c.name, "at 64 MiB") && !strings.Contains(c.name, "middle of the device") {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.size)
			c.make(t, r.dev, c.size)
			before := checksum(t, r.dev)
			_, err := r.stage(sampled).Prepare(context.Background())
			if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), c.found) {
				t.Fatalf("Prepare: %v\nwant ErrForeignData naming %q", err, c.found)
			}
			if checksum(t, r.dev) != before {
				t.Fatal("device changed")
			}
		})
	}
	// And a blank disk is still blank.
	r := newRig(t, testDiskSize)
	if plan, err := r.stage(sampled).Prepare(context.Background()); err != nil || plan.Rejoin {
		t.Fatalf("blank disk through preads: %+v, %v", plan, err)
	}
}
