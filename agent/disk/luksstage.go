package disk

import (
	"github.com/latchkey/latchkey/agent/disk/luks2"

	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/protocol"
)

// LUKS is the LUKS2 state-disk stage (see the package documentation).
type LUKS struct {
	cfg LUKSConfig

	mu sync.Mutex
	// held is the shared lock a first-boot Prepare keeps until Open, and
	// the device it proved blank (or latchkey's own interrupted install)
	// under it, so Open need not read the whole device again (lock.go).
	held *heldProof
}

var _ Stage = (*LUKS)(nil)

// NewLUKS checks cfg and fills in defaults.
func NewLUKS(cfg LUKSConfig) (*LUKS, error) {
	cfg.fillDefaults()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &LUKS{cfg: cfg}, nil
}

// Prepare waits for the device and decides: a latchkey header is a
// rejoin with its UUID; a blank device (or a foreign one WipeStateDisk
// names) gets a fresh random UUID; an interrupted header install keeps
// its UUID. Everything that can be known before attestation is refused
// here, so no ticket is fetched for a disk that cannot be used: a device
// that is missing, read-only or too small for the file system, foreign
// content, an altered latchkey header. Prepare never writes: if the ticket
// never comes, the disk is as it was.
func (l *LUKS) Prepare(ctx context.Context) (Plan, error) {
	l.dropHeld() // an earlier Prepare's
	d, err := l.openToPrepare(ctx)
	if err != nil {
		return Plan{}, err
	}
	defer d.Close()
	// Shared: an agent that is installing a header holds the lock
	// exclusively, so Prepare never sees its half-written state. A
	// first boot keeps it until Open (lock.go).
	lock, err := l.lockDisk(ctx, d, unix.LOCK_SH)
	if err != nil {
		return Plan{}, err
	}
	keep := false
	defer func() {
		if !keep {
			lock.unlock()
		}
	}()
	p, err := l.classify(ctx, d, false)
	if err != nil {
		return Plan{}, err
	}
	switch p.kind {
	case kindOurs:
		return Plan{UUID: p.uuid, Rejoin: true, KeyGeneration: planGeneration(p.hdr), Offline: luks2.OfflineTokenOf(p.hdr.JSON)}, nil
	case kindInterrupted:
		if err := l.usable(d, true); err != nil {
			return Plan{}, err
		}
		l.cfg.Logger.Warn("state disk: found an interrupted header install, checked byte for byte; it will be redone",
			slog.String(logkey.DiskUUID, p.uuid), slog.String(logkey.BlankCheck, p.rule))
		keep = l.keep(lock, d)
		return Plan{UUID: p.uuid}, nil
	case kindForeign:
		if err := l.refuseForeign(d, p); err != nil {
			return Plan{}, err
		}
	default:
		l.warnUnusedWipe(d)
	}
	if err := l.usable(d, true); err != nil {
		return Plan{}, err
	}
	if p.kind == kindBlank {
		l.cfg.Logger.Info("state disk: blank, admitted for a first boot", slog.String(logkey.Device, d.path),
			slog.String(logkey.BlankCheck, p.rule))
		keep = l.keep(lock, d)
	}
	return Plan{UUID: newUUID()}, nil
}

// openToPrepare waits for the device and opens it read-only (Prepare
// never writes), then refuses what needs no look at its content: a
// read-only device, or a kernel that cannot map it. Checking these first means no ticket is fetched for a disk
// that cannot be used. The caller closes the device.
func (l *LUKS) openToPrepare(ctx context.Context) (*device, error) {
	path, err := l.waitForDevice(ctx)
	if err != nil {
		return nil, err
	}
	d, err := openDevice(path, readOnly)
	if err != nil {
		return nil, err
	}
	if err := l.usable(d, false); err != nil {
		d.Close()
		return nil, err
	}
	if err := l.canMap(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Open formats (first boot) or validates (reboot) the header, unseals it
// with key, maps, makes or finds the file system, mounts it and the bind
// mounts. Every step checks what is already done, so a run cut short at
// any point is finished by the next one. The whole of Open holds an
// exclusive flock on the whole disk (lock.go) and classifies the device
// again from the locked descriptor, so a second agent on the same disk
// waits and then finds the first one's header instead of writing its own.
//
// A first boot writes keys.Generation into the new header, and a header
// on another generation is rewrapped to it before the volume is opened
// (rewrap.go).
func (l *LUKS) Open(ctx context.Context, plan Plan, keys Keys) (Result, error) {
	if err := keys.check(); err != nil {
		return Result{}, err
	}
	return l.open(ctx, plan, keys)
}

func (l *LUKS) open(ctx context.Context, plan Plan, keys Keys) (Result, error) {
	if !protocol.ValidDiskUUID(plan.UUID) {
		return Result{}, fmt.Errorf("luks disk stage: malformed plan UUID %q", plan.UUID)
	}
	path, err := l.waitForDevice(ctx)
	if err != nil {
		return Result{}, err
	}
	d, err := openDevice(path, readWrite)
	if err != nil {
		return Result{}, err
	}
	defer func() { d.Close() }()
	lock, proven, err := l.lockForOpen(ctx, d)
	if err != nil {
		return Result{}, err
	}
	defer lock.unlock()
	p, err := l.classify(ctx, d, proven)
	if err != nil {
		return Result{}, err
	}
	formatted := false
	if p.kind != kindOurs || p.uuid != plan.UUID {
		wrote, err := l.ensureHeader(ctx, plan, keys, d, p)
		if wrote && err != nil {
			return Result{}, fmt.Errorf("%w: %w", ErrHeaderWritten, err)
		}
		if err != nil {
			return Result{}, err
		}
		formatted = true
		l.cfg.Logger.Info("state disk: LUKS2 header installed on a disk admitted as blank", slog.String(logkey.Device, d.path),
			slog.String(logkey.DiskUUID, plan.UUID), slog.String(logkey.BlankCheck, p.rule))
		// Read back what is on the device now (through the page cache the
		// install wrote through), still under the lock.
		d.Close()
		if d, err = openDevice(path, readWrite); err != nil {
			return Result{}, err
		}
		if p, err = l.classify(ctx, d, false); err != nil {
			return Result{}, fmt.Errorf("%w: %w", ErrHeaderWritten, err)
		}
	}
	res, err := l.openVolume(ctx, d, p, plan.UUID, keys)
	if formatted && err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrHeaderWritten, err)
	}
	res.Formatted = formatted
	return res, err
}

// ensureHeader writes latchkey's header for plan.UUID, but only on a
// blank disk, over our own interrupted install, or over foreign data
// WipeStateDisk names; never over a complete latchkey header. The caller
// holds the disk's lock and classified d under it. wrote says the device
// was written to (so an error is not "nothing was formatted").
func (l *LUKS) ensureHeader(ctx context.Context, plan Plan, keys Keys, d *device, p probe) (wrote bool, err error) {
	if err := l.checkInstall(plan, keys, d, p); err != nil {
		return false, err
	}
	img, err := l.formatImage(ctx, plan.UUID, keys.Current, keys.Generation)
	if err != nil {
		return false, err
	}
	defer img.Close()
	if err := l.fault(StepFormatted); err != nil {
		return false, err
	}
	w, err := openDevice(d.path, exclusive)
	if err != nil {
		return false, err
	}
	defer w.Close()
	if w.rdev != d.rdev {
		return false, fmt.Errorf("%w: %s is now another device (%s, was %s)", ErrStateChanged, d.path, w.devno(), d.devno())
	}
	if err := l.install(w, img, p.kind == kindForeign); err != nil {
		return true, err
	}
	return true, l.fault(StepHeaderWritten)
}

// checkInstall refuses every state ensureHeader must not write over.
func (l *LUKS) checkInstall(plan Plan, keys Keys, d *device, p probe) error {
	switch {
	case p.kind == kindOurs:
		return fmt.Errorf("%w: the disk now carries latchkey's header for %s (another agent formatted it?), plan says %s; not rewriting it", ErrStateChanged, p.uuid, plan.UUID)
	case plan.Rejoin && p.err != nil:
		return fmt.Errorf("%w: %w", ErrStateChanged, p.err)
	case plan.Rejoin:
		return fmt.Errorf("%w: the LUKS2 header Prepare found is gone (now: %s)", ErrStateChanged, describeKind(p))
	case p.kind == kindInterrupted && p.uuid != plan.UUID:
		return fmt.Errorf("%w: interrupted header is for %s, plan says %s", ErrStateChanged, p.uuid, plan.UUID)
	case p.kind == kindInterrupted:
		if err := ownKeyslot(p.head, keys, d.size); err != nil {
			f := foreign(p.head, "an interrupted latchkey header install whose keyslot 0 area is not latchkey's ("+err.Error()+")")
			f.uuid = p.uuid
			if err := l.refuseForeign(d, f); err != nil {
				return err
			}
		}
	case p.kind == kindForeign:
		if err := l.refuseForeign(d, p); err != nil {
			return err
		}
	}
	return l.usable(d, true)
}

// openVolume unseals the header validated in p (read from d moments ago,
// never re-read; rewrapped in memory and on the disk first when it is on
// another generation than the ticket's key), maps it, and does the rest.
func (l *LUKS) openVolume(ctx context.Context, d *device, p probe, uuid string, keys Keys) (Result, error) {
	if p.kind != kindOurs || p.uuid != uuid {
		return Result{}, fmt.Errorf("%w: expected latchkey's header for %s, found %s", ErrStateChanged, uuid, describeKind(p))
	}
	p, err := l.settleGeneration(d, p, keys) // rewrap.go
	if err == nil {
		var res Result
		res, err = l.openSettled(ctx, d, p, uuid, keys)
		if err == nil {
			return res, nil
		}
	}
	if p.rewrapped {
		return Result{}, fmt.Errorf("%w: %w", ErrHeaderWritten, err)
	}
	return Result{}, err
}

// openSettled maps the volume of a header on the ticket's generation,
// makes or finds its file system and mounts it.
func (l *LUKS) openSettled(ctx context.Context, d *device, p probe, uuid string, keys Keys) (Result, error) {
	mapped, err := l.unsealAndMap(ctx, d, p, keys.Current)
	if err != nil {
		return Result{}, err
	}
	if err := l.fault(StepMapped); err != nil {
		return Result{}, err
	}
	fstype, made, err := l.ensureFileSystem(ctx, d, mapped, uuid)
	if err != nil {
		return Result{}, err
	}
	gen := keys.Generation
	res := Result{MountPoint: l.cfg.MountPoint, Device: mapped, UUID: uuid, FSType: fstype, MadeFileSystem: made, KeyGeneration: &gen}
	return l.mountAll(ctx, res)
}

// unsealAndMap keeps the unsealed volume (and its key) in this frame
// only, so nothing holds it once the kernel has it.
func (l *LUKS) unsealAndMap(ctx context.Context, d *device, p probe, key []byte) (string, error) {
	vol, err := unsealDetached(p.head, key, d.devno(), d.size)
	if err != nil {
		return "", err
	}
	return l.cfg.Kernel.MapCrypt(ctx, l.cfg.MapperName, vol)
}

// mountAll mounts the volume and the bind mounts and looks for kubelet
// credentials.
func (l *LUKS) mountAll(ctx context.Context, res Result) (Result, error) {
	if err := os.MkdirAll(l.cfg.MountPoint, 0o700); err != nil {
		return Result{}, fmt.Errorf("create mount point: %w", err)
	}
	if err := l.cfg.Kernel.Mount(ctx, res.Device, l.cfg.MountPoint, res.FSType); err != nil {
		return Result{}, err
	}
	if err := os.Chmod(l.cfg.MountPoint, 0o700); err != nil {
		return Result{}, fmt.Errorf("restrict state root: %w", err)
	}
	if err := l.fault(StepMounted); err != nil {
		return Result{}, err
	}
	for _, target := range l.cfg.BindMounts {
		if err := l.bind(ctx, target); err != nil {
			return Result{}, err
		}
	}
	if err := l.fault(StepBound); err != nil {
		return Result{}, err
	}
	res.HasKubeletCredentials = l.hasKubeletCredentials()
	return res, nil
}

// bind makes MountPoint/<target> on the state disk and binds it over
// target. The source takes the target's mode the first time.
func (l *LUKS) bind(ctx context.Context, target string) error {
	mode := os.FileMode(0o755)
	if st, err := os.Stat(target); err == nil && st.IsDir() {
		mode = st.Mode().Perm()
	}
	source := filepath.Join(l.cfg.MountPoint, target)
	if err := os.MkdirAll(source, mode); err != nil {
		return fmt.Errorf("bind source: %w", err)
	}
	if err := os.MkdirAll(target, mode); err != nil {
		return fmt.Errorf("bind target: %w", err)
	}
	return l.cfg.Kernel.Bind(ctx, source, target)
}

// hasKubeletCredentials looks on the state disk itself (not the bind
// targets), and only for files a bind mount persists.
func (l *LUKS) hasKubeletCredentials() bool {
	for _, f := range l.cfg.CredentialFiles {
		for _, b := range l.cfg.BindMounts {
			if !within(f, b) {
				continue
			}
			if st, err := os.Stat(filepath.Join(l.cfg.MountPoint, f)); err == nil && st.Mode().IsRegular() && st.Size() > 0 {
				return true
			}
		}
	}
	return false
}

// refuseForeign returns the refusal for foreign content, or nil (with a
// warning) when WipeStateDisk names this disk. An altered latchkey header
// is the node's own disk: the refusal says what was altered and points to
// the recovery path, never to wiping.
func (l *LUKS) refuseForeign(d *device, p probe) error {
	ok, err := l.wipeAllowed(d, p.uuid, p.what)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrForeignData, err)
	case ok:
		return nil
	case p.altered:
		return fmt.Errorf("%w: %w: %s holds %s: %s; not unlocking it. This is the node's own disk and its data is still there: "+
			"if you changed the header (for example added a recovery keyslot or a token), undo exactly that change "+
			"(docs/disk.md, \"Recovering an altered header\")", ErrForeignData, ErrHeaderRejected, d.path, p.what, headerReason(p.err))
	case p.err != nil:
		return fmt.Errorf("%w: %s holds %s: %w; not unlocking or formatting it (%s)",
			ErrForeignData, d.path, p.what, p.err, identify(d, p.uuid).suggestion())
	}
	return fmt.Errorf("%w: %s holds %s; not formatting it (%s)",
		ErrForeignData, d.path, p.what, identify(d, p.uuid).suggestion())
}

// headerReason is a validation error without the sentinel's prefix.
func headerReason(err error) string {
	return strings.TrimPrefix(err.Error(), ErrHeaderRejected.Error()+": ")
}

// warnUnusedWipe notes a WipeStateDisk that has nothing to destroy here
// (a blank disk): harmless, but the operator should remove it.
func (l *LUKS) warnUnusedWipe(d *device) {
	if l.cfg.WipeStateDisk != "" {
		l.cfg.Logger.Warn("state disk: wipeStateDisk is set but the disk is blank; nothing to destroy (remove the setting)",
			slog.String(logkey.Device, d.path), slog.String(logkey.WipeStateDisk, l.cfg.WipeStateDisk))
	}
}

func describeKind(p probe) string {
	switch p.kind {
	case kindBlank:
		return "a blank device"
	case kindOurs:
		return "latchkey's header for " + p.uuid
	case kindInterrupted:
		return "an interrupted header install for " + p.uuid
	}
	return p.what
}

func (l *LUKS) fault(s Step) error {
	if l.cfg.FaultHook == nil {
		return nil
	}
	if err := l.cfg.FaultHook(s); err != nil {
		return fmt.Errorf("fault at %s: %w", s, err)
	}
	return nil
}

// newUUID is a random (version 4) UUID in LUKS's lower-case form.
func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b) // never fails (crypto/rand panics instead)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return strings.ToLower(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]))
}
