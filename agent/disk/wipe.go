package disk

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/latchkey/latchkey/internal/logkey"
	"golang.org/x/sys/unix"
)

// WipeStateDisk names the one disk the operator allows the agent to
// destroy, so a value left in a baked image config, or a kernel command
// line copied to another machine, destroys nothing else: it must equal
// one of the identities of the disk at hand, read from the disk itself:
//
//   - its serial, as udev reports it (ID_SERIAL or ID_SERIAL_SHORT in the
//     udev database) or sysfs does (serial, device/serial);
//   - one of its /dev/disk/by-id/ names (a link that resolves to this very
//     device);
//   - the UUID of the LUKS header on it now.
//
// Paths like /dev/vdb are not accepted: they name a slot, not a disk.

// Where the identities are read (variables for tests).
var (
	udevDataDir = "/run/udev/data"
	byIDDir     = "/dev/disk/by-id"
)

const maxWipeTarget = 256

// checkWipeTarget validates the configured value's form.
func checkWipeTarget(v string) error {
	switch {
	case v == "":
		return nil
	case len(v) > maxWipeTarget || strings.ContainsAny(v, "\x00\n") || strings.TrimSpace(v) != v:
		return fmt.Errorf("luks disk stage: wipeStateDisk %q is not a disk serial, /dev/disk/by-id/ name or LUKS UUID", v)
	case strings.HasPrefix(v, "/") && !strings.HasPrefix(v, byIDDir+"/"):
		return fmt.Errorf("luks disk stage: wipeStateDisk %q: a path must be a %s/ name (a path like /dev/vdb names a slot, not a disk)", v, byIDDir)
	}
	return nil
}

// identities are the names of one disk that WipeStateDisk may use.
type identities struct {
	serials []string
	byID    []string
	luks    string
}

func (id identities) all() []string {
	out := append(append([]string(nil), id.serials...), id.byID...)
	if id.luks != "" {
		out = append(out, id.luks)
	}
	return out
}

// suggestion is the value to put in wipeStateDisk for this disk.
func (id identities) suggestion() string {
	if all := id.all(); len(all) > 0 {
		return fmt.Sprintf("to destroy it, set wipeStateDisk to %q (this disk's %s)", all[0], id.kindOf(all[0]))
	}
	return "it has no serial, /dev/disk/by-id/ name or LUKS UUID that wipeStateDisk could name, so the agent never destroys it; erase it yourself (wipefs -a, blkdiscard) if that is what you mean"
}

func (id identities) kindOf(v string) string {
	switch {
	case slices.Contains(id.serials, v):
		return "serial"
	case slices.Contains(id.byID, v):
		return "by-id name"
	}
	return "LUKS UUID"
}

func (id identities) String() string {
	var parts []string
	if len(id.serials) > 0 {
		parts = append(parts, "serial "+strings.Join(quoteAll(id.serials), " or "))
	}
	if len(id.byID) > 0 {
		parts = append(parts, "by-id "+strings.Join(id.byID, ", "))
	}
	if id.luks != "" {
		parts = append(parts, "LUKS UUID "+id.luks)
	}
	if len(parts) == 0 {
		return "no serial, by-id name or LUKS UUID"
	}
	return strings.Join(parts, "; ")
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}

// identify collects d's identities; luksUUID is the UUID of the LUKS
// header on it now ("" for none).
func identify(d *device, luksUUID string) identities {
	id := identities{luks: luksUUID}
	add := func(s string) {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(id.serials, s) {
			id.serials = append(id.serials, s)
		}
	}
	devno := fmt.Sprintf("%d:%d", unix.Major(d.rdev), unix.Minor(d.rdev))
	if b, err := os.ReadFile(filepath.Join(udevDataDir, "b"+devno)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			for _, key := range []string{"E:ID_SERIAL=", "E:ID_SERIAL_SHORT="} {
				if v, ok := strings.CutPrefix(line, key); ok {
					add(v)
				}
			}
		}
	}
	if dir, err := filepath.EvalSymlinks(filepath.Join(sysBlock, devno)); err == nil {
		for _, rel := range []string{"serial", "device/serial", "../serial", "../device/serial"} {
			if _, err := os.Stat(filepath.Join(dir, "partition")); err != nil && strings.HasPrefix(rel, "..") {
				continue // the parent's serial only for a partition
			}
			if b, err := os.ReadFile(filepath.Join(dir, rel)); err == nil && len(b) < maxWipeTarget {
				add(string(b))
			}
		}
	}
	if entries, err := os.ReadDir(byIDDir); err == nil {
		for _, e := range entries {
			p := filepath.Join(byIDDir, e.Name())
			if isDevice(p, d.rdev) {
				id.byID = append(id.byID, p)
			}
		}
	}
	return id
}

func isDevice(path string, rdev uint64) bool {
	var st unix.Stat_t
	return unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == rdev
}

// wipeAllowed says whether WipeStateDisk names d (whose LUKS header, if
// any, has luksUUID). Unset: false, nil. Set to another disk's name: an
// error that says so, and nothing is destroyed.
func (l *LUKS) wipeAllowed(d *device, luksUUID, what string) (bool, error) {
	v := l.cfg.WipeStateDisk
	if v == "" {
		return false, nil
	}
	id := identify(d, luksUUID)
	match := slices.Contains(id.all(), v)
	if !match && strings.HasPrefix(v, byIDDir+"/") {
		match = isDevice(v, d.rdev)
	}
	if !match {
		return false, fmt.Errorf("%w: wipeStateDisk is %q, which does not name this disk (%s has %s); nothing destroyed (it holds %s)",
			ErrWipeMismatch, v, d.path, id, what)
	}
	l.cfg.Logger.Warn("state disk: wipeStateDisk names this disk; destroying what it holds",
		slog.String(logkey.Device, d.path), slog.String(logkey.WipeStateDisk, v), slog.String(logkey.Found, what))
	return true, nil
}
