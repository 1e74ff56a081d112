package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"golang.org/x/sys/unix"
)

// device is the opened state device. It is opened once per Prepare or
// Open by its resolved path; everything after works on the descriptor,
// so a by-id link swapped midway changes nothing.
type device struct {
	f    *os.File
	path string // resolved /dev/... path
	size int64
	rdev uint64
}

// waitForDevice waits up to WaitTimeout for the configured device to
// exist as a block device (udev may create by-id links late at boot) and
// returns its resolved path.
func (l *LUKS) waitForDevice(ctx context.Context) (string, error) {
	deadline := l.cfg.Now().Add(l.cfg.WaitTimeout)
	for {
		path, err := resolveBlock(l.devicePath())
		if err == nil {
			return path, nil
		}
		if errors.Is(err, fs.ErrNotExist) && !l.cfg.Now().Before(deadline) {
			return "", fmt.Errorf("%w: state disk %s not found (waited %s; vanished, or never attached?): %w", ErrUnusable, l.devicePath(), l.cfg.WaitTimeout, err)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("state disk %s: %w", l.devicePath(), err)
		}
		if err := l.cfg.Sleep(ctx, l.cfg.PollInterval); err != nil {
			return "", fmt.Errorf("waiting for state disk %s: %w", l.devicePath(), err)
		}
	}
}

// devicePath is the configured path (PartLabel maps to its udev link).
func (l *LUKS) devicePath() string {
	if l.cfg.Device != "" {
		return l.cfg.Device
	}
	return filepath.Join("/dev/disk/by-partlabel", l.cfg.PartLabel)
}

func resolveBlock(p string) (string, error) {
	path, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if st.Mode()&fs.ModeDevice == 0 || st.Mode()&fs.ModeCharDevice != 0 {
		return "", fmt.Errorf("%s is not a block device", path)
	}
	return path, nil
}

// Open modes of the state device.
const (
	readOnly  = os.O_RDONLY
	readWrite = os.O_RDWR
	// exclusive is for writing a header: on a block device O_EXCL fails
	// while anything (a mount, a mapping) holds the device.
	exclusive = os.O_RDWR | unix.O_EXCL
)

// openDevice opens path in one of the modes above.
func openDevice(path string, flags int) (*device, error) {
	f, err := os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		if flags&(os.O_RDWR|os.O_WRONLY) != 0 && (errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES)) && isReadOnly(path) {
			return nil, fmt.Errorf("%w: state disk %s is read-only; the agent must write its LUKS header, state record and file system there (attach it read-write)", ErrUnusable, path)
		}
		if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV) || errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: state disk %s vanished: %w", ErrUnusable, path, err)
		}
		return nil, fmt.Errorf("open state disk: %w", err)
	}
	d := &device{f: f, path: path}
	if err := d.stat(); err != nil {
		f.Close()
		return nil, err
	}
	return d, nil
}

func (d *device) stat() error {
	var st unix.Stat_t
	if err := unix.Fstat(int(d.f.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", d.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("%s is not a block device", d.path)
	}
	size, err := d.f.Seek(0, io.SeekEnd) // a block device's end is its size
	if err != nil {
		return fmt.Errorf("size of %s: %w", d.path, err)
	}
	d.size, d.rdev = size, st.Rdev
	switch {
	case d.size == 0:
		return fmt.Errorf("%w: state disk %s has no medium (size 0): it vanished, was detached or is an empty drive", ErrUnusable, d.path)
	case d.size < minDeviceSize:
		return fmt.Errorf("%w: state disk %s is %d bytes, need at least %d", ErrUnusable, d.path, d.size, minDeviceSize)
	case d.size%luks2.SectorSize != 0:
		return fmt.Errorf("state disk %s size %d is not a multiple of %d", d.path, d.size, luks2.SectorSize)
	}
	return nil
}

// readOnly asks the kernel whether writes to the device are refused
// (BLKROGET: losetup -r, a write-protected disk, a read-only attachment).
func (d *device) kernelReadOnly() (bool, error) {
	ro, err := unix.IoctlGetInt(int(d.f.Fd()), unix.BLKROGET)
	if err != nil {
		return false, fmt.Errorf("BLKROGET %s: %w", d.path, err)
	}
	return ro != 0, nil
}

func isReadOnly(path string) bool {
	d, err := openDevice(path, readOnly)
	if err != nil {
		return false
	}
	defer d.Close()
	ro, err := d.kernelReadOnly()
	return err == nil && ro
}

// minSize is the smallest device a first boot can format with fstype:
// the 16 MiB header area plus the file system's minimum data segment
// (mkfs.xfs refuses less than 300 MiB; ext4 works in latchkey's 16 MiB).
func minSize(fstype string) int64 {
	if fstype == "xfs" {
		return luks2.DataOffset + 300*mib
	}
	return minDeviceSize
}

// usable refuses, before any ticket is fetched, a device the agent could
// never use: read-only, or (firstBoot) too small for the configured file
// system. (No medium and too small for the header are found when it is
// opened.)
func (l *LUKS) usable(d *device, firstBoot bool) error {
	ro, err := d.kernelReadOnly()
	if err != nil {
		return err
	}
	if ro {
		return fmt.Errorf("%w: state disk %s is read-only; the agent must write its LUKS header, state record and file system there (attach it read-write)", ErrUnusable, d.path)
	}
	if need := minSize(l.cfg.FSType); firstBoot && d.size < need {
		return fmt.Errorf("%w: state disk %s is %d bytes (%s), too small for fsType %s: it needs at least %d bytes (%d MiB: 16 MiB of LUKS header and %d MiB of file system); nothing was written",
			ErrUnusable, d.path, d.size, human(d.size), l.cfg.FSType, need, need/mib, (need-luks2.DataOffset)/mib)
	}
	return nil
}

// devno is the device number as dm-crypt tables take it ("major:minor"),
// pinning the mapping to the very device that was validated.
func (d *device) devno() string {
	return fmt.Sprintf("%d:%d", unix.Major(d.rdev), unix.Minor(d.rdev))
}

func (d *device) read(off int64, n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := d.f.ReadAt(b, off); err != nil {
		return nil, fmt.Errorf("read %s at %d: %w", d.path, off, err)
	}
	return b, nil
}

func (d *device) write(b []byte, off int64) error {
	if _, err := d.f.WriteAt(b, off); err != nil {
		return fmt.Errorf("write %s at %d: %w", d.path, off, err)
	}
	return nil
}

func (d *device) sync() error {
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", d.path, err)
	}
	return nil
}

func (d *device) Close() error { return d.f.Close() }
