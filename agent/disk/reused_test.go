package disk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Reused disks the sampled rule formatted: each layout is what a disk
// carries after an ordinary "wipe" (the MBR's first sector zeroed, a
// partition table zapped) or a reuse at an offset no sampling aligns
// with. Built with the real tools on sparse loop devices of 512 MiB and
// 1 GiB; each must be refused by the full check in Prepare and in Open,
// naming the exact first non-zero byte (found independently here, by
// reading the device) and the file system where the table knows it, with
// every non-zero block of the device unchanged.

// cylinder is a DOS-era cylinder (255 heads × 63 sectors) in bytes;
// partitions of old tools start at 63 sectors plus whole cylinders.
const cylinder = 255 * 63 * 512

// reusedLayout puts a reused disk's remains on dev.
type reusedLayout struct {
	name  string
	make  func(t *testing.T, dev string)
	named string // the format the refusal names ("" for random data)
}

// withFiles is a directory of a few files, for mkfs -d and mcopy.
func withFiles(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for i, n := range []int{100, 5000, 70000} {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file%d.txt", i)), []byte(strings.Repeat("reused disk data ", n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// dosPartition writes an MBR with one partition at start (bytes), puts
// fs there, then zeroes the first sector (the classic dd count=1 wipe).
func dosPartition(t *testing.T, dev string, start, size int64, mkfs func(sub string)) {
	t.Helper()
	run(t, []byte(fmt.Sprintf("label: dos\nstart=%d, size=%d, type=83\n", start/512, size/512)), "sfdisk", "-q", "--no-reread", dev)
	atOffset(t, dev, start, size, mkfs)
	writeDev(t, dev, 0, make([]byte, 512))
}

func mkext4(t *testing.T, files string, extra ...string) func(sub string) {
	return func(sub string) {
		args := append([]string{"-q", "-F", "-E", "nodiscard"}, extra...)
		if files != "" {
			args = append(args, "-d", files)
		}
		run(t, nil, "mkfs.ext4", append(args, sub)...)
	}
}

func mkvfat(t *testing.T, files string) func(sub string) {
	return func(sub string) {
		run(t, nil, "mkfs.vfat", sub)
		if files != "" {
			needTool(t, "mcopy", "mtools")
			entries, _ := os.ReadDir(files)
			for _, e := range entries {
				run(t, nil, "mcopy", "-i", sub, filepath.Join(files, e.Name()), "::/")
			}
		}
	}
}

func reusedLayouts() []reusedLayout {
	dos := int64(63*512 + 3*cylinder) // 23.6 MiB
	return []reusedLayout{
		{"DOS partition, first sector zeroed, ext4 with files", func(t *testing.T, dev string) {
			dosPartition(t, dev, dos, 64*mib, mkext4(t, withFiles(t)))
		}, "an ext2/3/4 file system"},
		{"DOS partition, first sector zeroed, 1 KiB-block ext4", func(t *testing.T, dev string) {
			dosPartition(t, dev, dos, 64*mib, mkext4(t, withFiles(t), "-b", "1024"))
		}, "an ext2/3/4 file system"},
		{"DOS partition, first sector zeroed, ext4 without lazy init", func(t *testing.T, dev string) {
			dosPartition(t, dev, dos, 64*mib, mkext4(t, "", "-E", "lazy_itable_init=0,lazy_journal_init=0"))
		}, "an ext2/3/4 file system"},
		{"DOS partition, first sector zeroed, vfat with files", func(t *testing.T, dev string) {
			needTool(t, "mkfs.vfat", "dosfstools")
			dosPartition(t, dev, dos, 32*mib, mkvfat(t, withFiles(t)))
		}, "a FAT (vfat) file system"},
		{"DOS partition, first sector zeroed, empty vfat", func(t *testing.T, dev string) {
			needTool(t, "mkfs.vfat", "dosfstools")
			dosPartition(t, dev, dos, 32*mib, mkvfat(t, ""))
		}, "a FAT (vfat) file system"},
		{"ext4 with files at 17.5 MiB", func(t *testing.T, dev string) {
			atOffset(t, dev, 17*mib+mib/2, 32*mib, mkext4(t, withFiles(t)))
		}, "an ext2/3/4 file system"},
		{"small vfat with files at an unaligned offset", func(t *testing.T, dev string) {
			needTool(t, "mkfs.vfat", "dosfstools")
			atOffset(t, dev, 100*mib+3*1024, 4*mib, mkvfat(t, withFiles(t)))
		}, "a FAT (vfat) file system"},
		{"small ext4 with files at an unaligned offset", func(t *testing.T, dev string) {
			atOffset(t, dev, 200*mib+7*512, 8*mib, mkext4(t, withFiles(t)))
		}, "an ext2/3/4 file system"},
		{"64 KiB random at an unaligned offset", func(t *testing.T, dev string) {
			writeDev(t, dev, 33*mib+777, randomNoMagic(64<<10))
		}, ""},
		{"256 KiB random at an unaligned offset", func(t *testing.T, dev string) {
			writeDev(t, dev, 150*mib+1234, randomNoMagic(256<<10))
		}, ""},
		{"900 KiB random at an unaligned offset", func(t *testing.T, dev string) {
			writeDev(t, dev, 400*mib+4097, randomNoMagic(900<<10))
		}, ""},
		{"LVM PV at an unaligned offset", func(t *testing.T, dev string) {
			atOffset(t, dev, 77*mib+3*1024, 64*mib, func(sub string) {
				run(t, nil, "pvcreate", "-ff", "-y", "--devices", sub, sub)
			})
		}, "an LVM physical volume"},
		{"LVM VG at an unaligned offset", func(t *testing.T, dev string) {
			atOffset(t, dev, 77*mib+3*1024, 64*mib, func(sub string) {
				run(t, nil, "pvcreate", "-ff", "-y", "--devices", sub, sub)
				run(t, nil, "vgcreate", "--autobackup", "n", "--devices", sub, fmt.Sprintf("lkreused%d", os.Getpid()), sub)
			})
		}, "an LVM physical volume"},
		{"bcache backing device at an unaligned offset", func(t *testing.T, dev string) {
			needTool(t, "make-bcache", "bcache-tools")
			atOffset(t, dev, 123*mib+5*1024, 64*mib, func(sub string) { run(t, nil, "make-bcache", "-B", sub) })
		}, "a bcache device"},
		{"btrfs at 64 MiB + 100 KiB", func(t *testing.T, dev string) {
			needTool(t, "mkfs.btrfs", "btrfs-progs")
			atOffset(t, dev, 64*mib+100*1024, 128*mib, func(sub string) { run(t, nil, "mkfs.btrfs", "-q", "-f", "-K", sub) })
		}, "a btrfs file system"},
		{"swap at a cylinder boundary", func(t *testing.T, dev string) {
			atOffset(t, dev, 10*cylinder, 32*mib, func(sub string) { run(t, nil, "mkswap", sub) })
		}, "a swap area"},
	}
}

// deviceContent reads dev with O_DIRECT (no page-cache pollution) and
// returns a digest of every non-zero 4 KiB block with its offset, and the
// offset of the first non-zero byte (-1: none).
func deviceContent(t *testing.T, dev string) (string, int64) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	first := int64(-1)
	buf := alignedBuffer(4 * mib)
	for off := int64(0); ; off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		for b := 0; b < n; b += 4096 {
			blk := buf[b:min(b+4096, n)]
			if k := firstNonZero(blk); k >= 0 {
				if first < 0 {
					first = off + int64(b+k)
				}
				fmt.Fprintf(h, "%d:", off+int64(b))
				h.Write(blk)
			}
		}
		if n < len(buf) || err != nil {
			break
		}
	}
	return hex.EncodeToString(h.Sum(nil)), first
}

// newRigOn is newRig on a device the test made (a 4Kn loop device).
func newRigOn(t *testing.T, dev string) *testRig {
	return &testRig{t: t, dev: dev, root: t.TempDir(), logs: &bytes.Buffer{}, kernel: newLoopKernel(t)}
}

// loop4Kn is a sparse loop device with 4096-byte logical sectors.
func loop4Kn(t *testing.T, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk4k.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(run(t, nil, "losetup", "--find", "--show", "--sector-size", "4096", img))
	t.Cleanup(func() { detachLoop(t, dev) })
	return dev
}

func TestReusedDisksRefusedAndUnchanged(t *testing.T) {
	requireRoot(t)
	for _, size := range []int64{512 * mib, 1024 * mib} {
		for _, c := range reusedLayouts() {
			t.Run(fmt.Sprintf("%s, %d MiB", c.name, size/mib), func(t *testing.T) {
				r := newRig(t, size)
				c.make(t, r.dev)
				checkReusedRefused(t, r, c.named)
			})
		}
		t.Run(fmt.Sprintf("4Kn GPT zapped, vfat at 20 MiB + 8 KiB, %d MiB", size/mib), func(t *testing.T) {
			needTool(t, "mkfs.vfat", "dosfstools")
			r := newRigOn(t, loop4Kn(t, size))
			run(t, nil, "sgdisk", "-o", "-n", "1:5122:+32M", r.dev)
			atOffset(t, r.dev, 20*mib+8*1024, 32*mib, mkvfat(t, withFiles(t)))
			run(t, nil, "sgdisk", "--zap-all", r.dev)
			checkReusedRefused(t, r, "a FAT (vfat) file system at byte 20979712 (20 MiB + 8 KiB)")
		})
	}
}

// checkReusedRefused runs Prepare and Open (a first-boot plan) on r's
// device and checks both refuse naming the first non-zero byte and
// named, and that no non-zero block changed.
func checkReusedRefused(t *testing.T, r *testRig, named string) {
	t.Helper()
	before, first := deviceContent(t, r.dev)
	if first < 0 {
		t.Fatal("the layout left the device blank")
	}
	l := r.stage(nil)
	_, err := l.Prepare(context.Background())
	checkRefusal(t, "Prepare", err, first, named)
	_, err = l.Open(context.Background(), Plan{UUID: newUUID()}, Keys{Current: testKey(1)})
	checkRefusal(t, "Open", err, first, named)
	if r.rec.Ran("cryptsetup luksFormat")+r.rec.Ran("mkfs") != 0 || r.kernel.mapped() != 0 {
		t.Fatal("formatted or mapped a reused disk")
	}
	if after, _ := deviceContent(t, r.dev); after != before {
		t.Fatal("device changed")
	}
	t.Logf("refusal: %v", err)
}

func checkRefusal(t *testing.T, step string, err error, first int64, named string) {
	t.Helper()
	if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), at(first)) || !strings.Contains(err.Error(), named) {
		t.Fatalf("%s: %v\nwant ErrForeignData naming %q and the first non-zero byte, %s", step, err, named, at(first))
	}
	if named == "" && !strings.Contains(err.Error(), "unrecognised non-zero data at "+at(first)) {
		t.Fatalf("%s: %v\nwant unrecognised data at %s", step, err, at(first))
	}
}
