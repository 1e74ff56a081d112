package disk

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// LUKS is the LUKS2 state-disk stage (see the package documentation).
type LUKS struct {
	cfg LUKSConfig
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
// rejoin with its UUID; a blank device (or, with WipeStateDisk, a foreign
// one) gets a fresh random UUID; an interrupted header install keeps its
// UUID. Prepare never writes: if the ticket never comes, the disk is as
// it was.
func (l *LUKS) Prepare(ctx context.Context) (Plan, error) {
	d, p, err := l.openAndClassify(ctx)
	if err != nil {
		return Plan{}, err
	}
	d.Close()
	switch p.kind {
	case kindOurs:
		return Plan{UUID: p.uuid, Rejoin: true}, nil
	case kindInterrupted:
		l.cfg.Logger.Warn("state disk: found an interrupted header install; it will be redone", slog.String("uuid", p.uuid))
		return Plan{UUID: p.uuid}, nil
	case kindForeign:
		if err := l.refuseForeign(d.path, p); err != nil {
			return Plan{}, err
		}
	}
	return Plan{UUID: newUUID()}, nil
}

// Open formats (first boot) or validates (reboot) the header, unseals it
// with key, maps, makes or finds the file system, mounts it and the bind
// mounts. Every step checks what is already done, so a run cut short at
// any point is finished by the next one.
func (l *LUKS) Open(ctx context.Context, plan Plan, key []byte) (Result, error) {
	if len(key) != KeySize {
		return Result{}, fmt.Errorf("luks disk stage: ticket key is %d bytes, want %d", len(key), KeySize)
	}
	if !uuidPattern.MatchString(plan.UUID) {
		return Result{}, fmt.Errorf("luks disk stage: malformed plan UUID %q", plan.UUID)
	}
	d, p, err := l.openAndClassifyMode(ctx, readWrite)
	if err != nil {
		return Result{}, err
	}
	formatted := false
	if p.kind != kindOurs || p.uuid != plan.UUID {
		d.Close()
		if err := l.ensureHeader(ctx, plan, key, d.path, p); err != nil {
			return Result{}, err
		}
		formatted = true
		if d, p, err = l.openAndClassifyMode(ctx, readWrite); err != nil {
			return Result{}, err
		}
	}
	defer d.Close()
	res, err := l.openVolume(ctx, d, p, plan.UUID, key)
	res.Formatted = formatted
	return res, err
}

// ensureHeader writes latchkey's header for plan.UUID, but only on a
// blank disk, over our own interrupted install, or (WipeStateDisk) over
// foreign data; never over a complete latchkey header.
func (l *LUKS) ensureHeader(ctx context.Context, plan Plan, key []byte, path string, p probe) error {
	switch {
	case p.kind == kindOurs:
		return fmt.Errorf("%w: header UUID is %s, plan says %s", ErrStateChanged, p.uuid, plan.UUID)
	case plan.Rejoin && p.err != nil:
		return fmt.Errorf("%w: %w", ErrStateChanged, p.err)
	case plan.Rejoin:
		return fmt.Errorf("%w: the LUKS2 header Prepare found is gone (now: %s)", ErrStateChanged, describeKind(p))
	case p.kind == kindInterrupted && p.uuid != plan.UUID:
		return fmt.Errorf("%w: interrupted header is for %s, plan says %s", ErrStateChanged, p.uuid, plan.UUID)
	case p.kind == kindForeign:
		if err := l.refuseForeign(path, p); err != nil {
			return err
		}
	}
	img, err := l.formatImage(ctx, plan.UUID, key)
	if err != nil {
		return err
	}
	defer img.Close()
	if err := l.fault(StepFormatted); err != nil {
		return err
	}
	d, err := openDevice(path, exclusive)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := l.install(d, img, p.kind == kindForeign); err != nil {
		return err
	}
	return l.fault(StepHeaderWritten)
}

// openVolume unseals the header validated in p (read from d moments ago,
// never re-read), maps it, and does the rest.
func (l *LUKS) openVolume(ctx context.Context, d *device, p probe, uuid string, key []byte) (Result, error) {
	if p.kind != kindOurs || p.uuid != uuid {
		return Result{}, fmt.Errorf("%w: expected latchkey's header for %s, found %s", ErrStateChanged, uuid, describeKind(p))
	}
	mapped, err := l.unsealAndMap(ctx, d, p, key)
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
	res := Result{MountPoint: l.cfg.MountPoint, Device: mapped, UUID: uuid, FSType: fstype, MadeFileSystem: made}
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
	l.cfg.Logger.Info("state disk open", slog.String("uuid", res.UUID), slog.String("device", res.Device),
		slog.String("mount", res.MountPoint), slog.Bool("kubelet_credentials", res.HasKubeletCredentials))
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

func (l *LUKS) openAndClassify(ctx context.Context) (*device, probe, error) {
	return l.openAndClassifyMode(ctx, readOnly)
}

func (l *LUKS) openAndClassifyMode(ctx context.Context, mode int) (*device, probe, error) {
	path, err := l.waitForDevice(ctx)
	if err != nil {
		return nil, probe{}, err
	}
	d, err := openDevice(path, mode)
	if err != nil {
		return nil, probe{}, err
	}
	p, err := l.classify(ctx, d)
	if err != nil {
		d.Close()
		return nil, probe{}, err
	}
	return d, p, nil
}

// refuseForeign returns the refusal for foreign content, or nil (with a
// warning) when WipeStateDisk allows destroying it.
func (l *LUKS) refuseForeign(path string, p probe) error {
	if !l.cfg.WipeStateDisk && p.err != nil {
		return fmt.Errorf("%w: %w: %s: not unlocking or formatting it (set WipeStateDisk to destroy it)", ErrForeignData, p.err, path)
	}
	if !l.cfg.WipeStateDisk {
		return fmt.Errorf("%w: %s holds %s; not formatting it (set WipeStateDisk to destroy it)", ErrForeignData, path, p.what)
	}
	l.cfg.Logger.Warn("state disk: WipeStateDisk set, foreign content will be destroyed", slog.String("device", path), slog.String("found", p.what))
	return nil
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
