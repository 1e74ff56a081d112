package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/latchkey/latchkey/internal/logkey"
	"golang.org/x/sys/unix"
)

// One agent per disk. Open holds an exclusive BSD flock on the whole-disk
// device from before it classifies the device until it returns, and
// Prepare a shared one while it reads: the convention of udev (which
// skips a disk it cannot lock shared), systemd-repart, util-linux's
// mkfs/sfdisk --lock and cryptsetup's own device locking. So two agents
// started together on one blank disk serialise: the second classifies
// again from its locked descriptor, finds the first's committed header,
// and stops (ErrStateChanged) instead of writing its own over it. The
// lock is on the whole disk even when the state device is a partition:
// partition tools lock the whole disk, and so must a format.

// diskLock is a held flock.
type diskLock struct {
	f    *os.File
	path string
}

// lockDisk takes the flock (unix.LOCK_EX or unix.LOCK_SH) on the whole
// disk under d, waiting up to LockTimeout for another holder to let go.
func (l *LUKS) lockDisk(ctx context.Context, d *device, how int) (*diskLock, error) {
	path, err := wholeDisk(d.rdev)
	if err != nil {
		// No sysfs (a minimal initramfs): lock the device itself, which
		// still serialises agents configured with the same device.
		l.cfg.Logger.Debug("state disk: whole disk unknown, locking the device itself", slog.String(logkey.Device, d.path), slog.String(logkey.Error, err.Error()))
		path = d.path
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s to lock it: %w", path, err)
	}
	deadline := l.cfg.Now().Add(l.cfg.LockTimeout)
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return &diskLock{f: f, path: path}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !l.cfg.Now().Before(deadline) {
			f.Close()
			return nil, fmt.Errorf("state disk %s is locked by another process (another latchkey agent, udev or a disk tool) for more than %s; not touching it", path, l.cfg.LockTimeout)
		}
		if err := l.cfg.Sleep(ctx, l.cfg.PollInterval); err != nil {
			f.Close()
			return nil, fmt.Errorf("waiting for the lock on %s: %w", path, err)
		}
	}
}

func (k *diskLock) unlock() {
	if k != nil {
		k.f.Close() // closing the last descriptor releases the flock
	}
}

// sysBlock is where the block devices' sysfs entries are (a variable for
// tests).
var sysBlock = "/sys/dev/block"

// wholeDisk returns the /dev path of the disk the block device rdev is
// on: itself, or for a partition (sysfs has a "partition" attribute) its
// parent directory in sysfs.
func wholeDisk(rdev uint64) (string, error) {
	dir, err := filepath.EvalSymlinks(filepath.Join(sysBlock, fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))))
	if err != nil {
		return "", fmt.Errorf("find the disk of %d:%d in sysfs: %w", unix.Major(rdev), unix.Minor(rdev), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Dir(dir)
	}
	name, err := devName(dir)
	if err != nil {
		return "", err
	}
	return "/dev/" + name, nil
}

// devName reads DEVNAME from a sysfs block directory's uevent.
func devName(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "uevent"))
	if err != nil {
		return "", fmt.Errorf("read %s/uevent: %w", dir, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "DEVNAME="); ok && v != "" && !strings.Contains(v, "..") {
			return v, nil
		}
	}
	return "", fmt.Errorf("no DEVNAME in %s/uevent", dir)
}

// Read once. A first boot's Prepare reads the whole device to prove it
// blank, under the shared lock, and keeps that lock until Open. Open
// turns it into the exclusive lock with one non-blocking flock call: the
// kernel converts a lock atomically when no one else holds it, so if the
// call succeeds no other agent or disk tool (all of which take the lock
// to write) can have written since the proof, and Open re-reads only the
// first 16 MiB and the last 4 MiB instead of the whole device. If another
// holder keeps the conversion from succeeding, the kernel has already
// dropped the shared lock, so Open waits for the exclusive one and proves
// the device again from its locked descriptor. A writer that takes no
// lock at all (dd) is not kept out by any lock; it is what the re-read of
// both ends is for.

// heldProof is a shared lock Prepare kept, and the device it proved
// under it.
type heldProof struct {
	lock       *diskLock
	rdev       uint64
	size       int64
	provedWith string // the blank-check rule
}

// keep stores lock as held for Open; it reports true (the caller must
// not unlock it).
func (l *LUKS) keep(lock *diskLock, d *device) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = &heldProof{lock: lock, rdev: d.rdev, size: d.size, provedWith: l.cfg.BlankCheck}
	return true
}

// dropHeld lets go of a lock an earlier Prepare kept.
func (l *LUKS) dropHeld() {
	if h := l.takeHeld(); h != nil {
		h.lock.unlock()
	}
}

// takeHeld hands the held lock (if any) to the caller.
func (l *LUKS) takeHeld() *heldProof {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.held
	l.held = nil
	return h
}

// lockForOpen takes the exclusive lock for Open. proven says the lock
// was converted from Prepare's without a gap, on the device Prepare
// proved, under the same rule.
func (l *LUKS) lockForOpen(ctx context.Context, d *device) (*diskLock, bool, error) {
	if h := l.takeHeld(); h != nil {
		if h.rdev == d.rdev && h.size == d.size && h.provedWith == l.cfg.BlankCheck {
			if err := unix.Flock(int(h.lock.f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
				return h.lock, true, nil
			}
		}
		h.lock.unlock()
	}
	lock, err := l.lockDisk(ctx, d, unix.LOCK_EX)
	return lock, false, err
}
