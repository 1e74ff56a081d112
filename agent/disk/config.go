package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/latchkey/latchkey/internal/clock"
	"github.com/latchkey/latchkey/internal/execx"
)

// Defaults for LUKSConfig's zero values.
const (
	DefaultMountPoint   = "/var/lib/latchkey/state"
	DefaultMapperName   = "latchkey-state"
	DefaultWaitTimeout  = 30 * time.Second
	DefaultPollInterval = 100 * time.Millisecond
	DefaultFSType       = "ext4"
	DefaultLockTimeout  = 2 * time.Minute
)

// The blank-check rules (LUKSConfig.BlankCheck).
const (
	BlankCheckFull    = "full"
	BlankCheckSampled = "sampled"
)

// DefaultBindMounts are the directories that must survive a reboot for a
// node to come back as itself: kubeadm's config and PKI, the kubelet's
// credentials, etcd's data (control-plane nodes) and the container images.
var DefaultBindMounts = []string{"/etc/kubernetes", "/var/lib/kubelet", "/var/lib/etcd", "/var/lib/containerd"}

// DefaultCredentialFiles: kubeadm's own "already joined" test is the
// first; the second is where the kubelet keeps its rotated client
// certificate.
var DefaultCredentialFiles = []string{"/etc/kubernetes/kubelet.conf", "/var/lib/kubelet/pki/kubelet-client-current.pem"}

// LUKSConfig configures the LUKS state-disk stage. The zero value of every
// option is the safe one; only the device must be named.
type LUKSConfig struct {
	// Device is the state disk: a /dev path or a /dev/disk/by-id,
	// by-path or by-partlabel link. Exactly one of Device and PartLabel.
	Device string
	// PartLabel names the disk by GPT partition label instead
	// (/dev/disk/by-partlabel/<PartLabel>).
	PartLabel string
	// WaitTimeout bounds the wait for the device to appear (udev may be
	// late at early boot). Default DefaultWaitTimeout.
	WaitTimeout time.Duration
	// PollInterval is the pause between looks for the device (default
	// DefaultPollInterval).
	PollInterval time.Duration
	// MountPoint is where the state file system is mounted (default
	// DefaultMountPoint). Bind-mount sources live under it: the state of
	// /var/lib/kubelet is MountPoint/var/lib/kubelet.
	MountPoint string
	// BindMounts are the directories bind-mounted from the state disk
	// (nil means DefaultBindMounts; an empty non-nil slice means none).
	BindMounts []string
	// CredentialFiles are the files whose presence (non-empty, under one
	// of BindMounts, looked up on the state disk) means the node already
	// joined. Default DefaultCredentialFiles.
	CredentialFiles []string
	// FSType is the file system made on first boot: "ext4" (default) or
	// "xfs". An existing file system is mounted as what it is.
	FSType string
	// MapperName is the dm-crypt device name (default DefaultMapperName).
	MapperName string
	// WipeStateDisk names the one disk the operator allows the agent to
	// destroy (wipe.go): its serial, a /dev/disk/by-id/ name, or the UUID
	// of the LUKS header on it now. If it names the disk at hand, a device
	// that holds something latchkey did not create (a file system,
	// partition table, LVM, LUKS1, a rejected LUKS2 header, unrecognised
	// data), or a volume whose file system is missing, is destroyed and
	// formatted; if it names another disk, the disk is refused and nothing
	// is destroyed. A valid latchkey header is never wiped, whatever this
	// says. Meant for one boot (latchkey.wipeStateDisk= on the kernel
	// command line), not a standing setting. Empty (the default): never.
	WipeStateDisk string
	// BlankCheck is the rule that admits a device as blank for a first
	// boot: BlankCheckFull (the default) reads every byte and formats
	// only a device that is zero throughout; BlankCheckSampled is the
	// older sampled rule (scan.go), only for images whose state disk is
	// known to be created with the VM (docs/configuration.md states the
	// risk).
	BlankCheck string
	// Progress, when set, receives a long blank check's progress every
	// few seconds (the agent sends it to systemd as STATUS= and
	// EXTEND_TIMEOUT_USEC=).
	Progress Progress
	// LockTimeout bounds the wait for the whole-disk lock another agent
	// or disk tool holds (default DefaultLockTimeout).
	LockTimeout time.Duration
	// Runner runs cryptsetup, blkid and mkfs (default execx.New).
	Runner execx.Runner
	// Kernel maps, mounts and binds (default SystemKernel).
	Kernel Kernel
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// FaultHook, when set, is called at every Step of Open; an error stops
	// Open there as if the agent had been killed (crash tests).
	FaultHook func(Step) error
	// Now and Sleep drive the device wait (defaults time.Now and a
	// context-aware sleep).
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
}

func (c *LUKSConfig) fillDefaults() {
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.MountPoint == "" {
		c.MountPoint = DefaultMountPoint
	}
	if c.BindMounts == nil {
		c.BindMounts = append([]string(nil), DefaultBindMounts...)
	}
	if c.CredentialFiles == nil {
		c.CredentialFiles = append([]string(nil), DefaultCredentialFiles...)
	}
	if c.FSType == "" {
		c.FSType = DefaultFSType
	}
	if c.MapperName == "" {
		c.MapperName = DefaultMapperName
	}
	if c.BlankCheck == "" {
		c.BlankCheck = BlankCheckFull
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Runner == nil {
		c.Runner = execx.New(execx.Config{Logger: c.Logger})
	}
	if c.Kernel == nil {
		c.Kernel = SystemKernel{}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Sleep == nil {
		c.Sleep = clock.Sleep
	}
}

func (c *LUKSConfig) check() error {
	if (c.Device == "") == (c.PartLabel == "") {
		return errors.New("luks disk stage: set exactly one of Device and PartLabel")
	}
	if c.PartLabel != "" && strings.ContainsAny(c.PartLabel, "/\x00") {
		return fmt.Errorf("luks disk stage: bad partition label %q", c.PartLabel)
	}
	if c.BlankCheck != BlankCheckFull && c.BlankCheck != BlankCheckSampled {
		return fmt.Errorf("luks disk stage: blank check %q, want %s or %s", c.BlankCheck, BlankCheckFull, BlankCheckSampled)
	}
	if c.FSType != "ext4" && c.FSType != "xfs" {
		return fmt.Errorf("luks disk stage: file system %q, want ext4 or xfs", c.FSType)
	}
	if strings.ContainsAny(c.MapperName, "/ \x00") || len(c.MapperName) > 127 {
		return fmt.Errorf("luks disk stage: bad mapper name %q", c.MapperName)
	}
	if err := checkWipeTarget(c.WipeStateDisk); err != nil {
		return err
	}
	if !cleanAbs(c.MountPoint) || c.MountPoint == "/" {
		return fmt.Errorf("luks disk stage: mount point %q must be a clean absolute path", c.MountPoint)
	}
	return checkBinds(c.MountPoint, c.BindMounts)
}

// checkBinds refuses bind targets that would shadow the mount point or
// each other (binding /var/lib over /var/lib/latchkey/state, say).
func checkBinds(mountPoint string, binds []string) error {
	for i, b := range binds {
		if !cleanAbs(b) || b == "/" {
			return fmt.Errorf("luks disk stage: bind mount %q must be a clean absolute path", b)
		}
		if within(b, mountPoint) || within(mountPoint, b) {
			return fmt.Errorf("luks disk stage: bind mount %s overlaps the mount point %s", b, mountPoint)
		}
		for _, o := range binds[:i] {
			if within(b, o) || within(o, b) {
				return fmt.Errorf("luks disk stage: bind mounts %s and %s overlap", o, b)
			}
		}
	}
	return nil
}

func cleanAbs(p string) bool {
	return filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}

// within reports whether p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}
