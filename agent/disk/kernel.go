package disk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/anatol/devmapper.go"
	"github.com/anatol/luks.go"
	"golang.org/x/sys/unix"
)

// Kernel is the part of Open that needs device-mapper and mount(2),
// behind an interface so everything before it (probing, formatting,
// validation, unsealing, the state record, mkfs) runs and is tested on
// machines without device-mapper.
type Kernel interface {
	// MapCrypt creates the dm-crypt device name from vol, or adopts the
	// one an earlier run of this boot created for the same disk, and
	// returns the path of the opened volume.
	MapCrypt(ctx context.Context, name string, vol *luks.Volume) (string, error)
	// Mount mounts the file system on source at target; a no-op when
	// source is already mounted there.
	Mount(ctx context.Context, source, target, fstype string) error
	// Bind bind-mounts source at target; a no-op when already done.
	Bind(ctx context.Context, source, target string) error
}

// MapChecker is a Kernel that can tell, before anything is written,
// whether it will be able to map the volume at all.
type MapChecker interface {
	CanMap(ctx context.Context) error
}

// canMap refuses, in Prepare and before any connection, a kernel that
// cannot map the volume: without device-mapper a first boot would write
// its header and then fail.
func (l *LUKS) canMap(ctx context.Context) error {
	c, ok := l.cfg.Kernel.(MapChecker)
	if !ok {
		return nil
	}
	if err := c.CanMap(ctx); err != nil {
		return fmt.Errorf("%w: %w; nothing was written", ErrUnusable, err)
	}
	return nil
}

// CanMap asks device-mapper for its version (DM_VERSION on
// /dev/mapper/control). The crypt target itself loads on demand with the
// first table (the kernel's module autoload), which needs no modprobe.
func (SystemKernel) CanMap(context.Context) error {
	if _, _, _, err := devmapper.GetVersion(); err != nil {
		return fmt.Errorf("%w (the kernel needs CONFIG_BLK_DEV_DM and CONFIG_DM_CRYPT to open the state disk): %v", ErrNoDeviceMapper, err)
	}
	return nil
}

// SystemKernel is the real Kernel: dm-crypt through luks.go and
// devmapper.go, mounts through mount(2), idempotence checked against
// /proc/self/mountinfo.
type SystemKernel struct{}

// MapCrypt creates or adopts the mapping. The kernel creates /dev/dm-N
// itself (devtmpfs), so the path does not wait for udev's /dev/mapper
// link; the crypt target module loads on demand with the table.
func (SystemKernel) MapCrypt(_ context.Context, name string, vol *luks.Volume) (string, error) {
	if _, _, _, err := devmapper.GetVersion(); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoDeviceMapper, err)
	}
	wantUUID := fmt.Sprintf("CRYPT-%s-%s-%s", vol.LuksType, strings.ReplaceAll(vol.UUID, "-", ""), name)
	info, err := devmapper.InfoByName(name)
	if err == nil {
		return adoptMapping(info, wantUUID, vol.BackingDevice)
	}
	if !errors.Is(err, unix.ENXIO) {
		return "", fmt.Errorf("look up mapping %s: %w", name, err)
	}
	if err := vol.SetupMapper(name); err != nil {
		return "", fmt.Errorf("create dm-crypt mapping %s: %w", name, err)
	}
	info, err = devmapper.InfoByName(name)
	if err != nil {
		return "", fmt.Errorf("look up new mapping %s: %w", name, err)
	}
	return dmPath(info.DevNo), nil
}

// adoptMapping accepts an existing mapping only if it is the one luks.go
// makes for this disk (same dm UUID) and sits on the validated device.
func adoptMapping(info *devmapper.DeviceInfo, wantUUID, backing string) (string, error) {
	if info.UUID != wantUUID {
		return "", fmt.Errorf("mapping %s exists with dm UUID %q, want %q", info.Name, info.UUID, wantUUID)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(info.DevNo), unix.Minor(info.DevNo))
	slaves, err := os.ReadDir("/sys/dev/block/" + dev + "/slaves")
	if err != nil || len(slaves) != 1 {
		return "", fmt.Errorf("mapping %s: cannot confirm its backing device: %v", info.Name, err)
	}
	got, err := os.ReadFile(filepath.Join("/sys/class/block", slaves[0].Name(), "dev"))
	if err != nil || strings.TrimSpace(string(got)) != backing {
		return "", fmt.Errorf("mapping %s sits on %s, not the state disk %s", info.Name, strings.TrimSpace(string(got)), backing)
	}
	return dmPath(info.DevNo), nil
}

func dmPath(devno uint64) string { return "/dev/dm-" + strconv.Itoa(int(unix.Minor(devno))) }

// Mount mounts source at target unless that is already so.
func (SystemKernel) Mount(_ context.Context, source, target, fstype string) error {
	m, err := mountAt(target)
	if err != nil {
		return err
	}
	if m != nil {
		if same, err := sameDevice(source, m.devno); err != nil || !same || m.root != "/" {
			return fmt.Errorf("%s is already a mount point of %s (%s), not of %s", target, m.source, m.devno, source)
		}
		return nil
	}
	if err := unix.Mount(source, target, fstype, 0, ""); err != nil {
		return fmt.Errorf("mount %s on %s: %w", source, target, err)
	}
	return nil
}

// Bind bind-mounts source at target unless that is already so.
func (SystemKernel) Bind(_ context.Context, source, target string) error {
	m, err := mountAt(target)
	if err != nil {
		return err
	}
	if m != nil {
		src, err := mountContaining(source)
		if err != nil || src == nil || src.devno != m.devno || m.root != bindRoot(src, source) {
			return fmt.Errorf("%s is already a mount point of %s, not a bind of %s", target, m.source, source)
		}
		return nil
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", source, target, err)
	}
	return nil
}

// bindRoot is the mountinfo root a bind of source (inside mount src)
// shows.
func bindRoot(src *mountEntry, source string) string {
	rel := strings.TrimPrefix(source, src.target)
	return filepath.Join(src.root, "/"+rel)
}

// sameDevice reports whether the block device at path has devno
// ("major:minor").
func sameDevice(path, devno string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, err
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)) == devno, nil
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	devno, root, target, fstype, source string
}

func readMountInfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if e, ok := parseMountInfoLine(sc.Text()); ok {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// parseMountInfoLine parses "id parent maj:min root target opts [tags] -
// fstype source superopts".
func parseMountInfoLine(line string) (mountEntry, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	f, g := strings.Fields(pre), strings.Fields(post)
	if !ok || len(f) < 5 || len(g) < 2 {
		return mountEntry{}, false
	}
	return mountEntry{devno: f[2], root: unescape(f[3]), target: unescape(f[4]), fstype: g[0], source: unescape(g[1])}, true
}

// unescape decodes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountAt returns the topmost mount at exactly target, or nil.
func mountAt(target string) (*mountEntry, error) {
	entries, err := readMountInfo()
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var top *mountEntry
	for i := range entries {
		if entries[i].target == target {
			top = &entries[i]
		}
	}
	return top, nil
}

// mountContaining returns the mount whose target is the longest prefix of
// path.
func mountContaining(path string) (*mountEntry, error) {
	entries, err := readMountInfo()
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var best *mountEntry
	for i := range entries {
		if within(path, entries[i].target) || entries[i].target == "/" {
			if best == nil || len(entries[i].target) >= len(best.target) {
				best = &entries[i]
			}
		}
	}
	return best, nil
}
