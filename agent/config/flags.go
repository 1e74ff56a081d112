package config

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/latchkey/latchkey/internal/cli"
)

// Flags are the agent's command-line overrides. Load merges the three
// sources in one order, the documented one: the config file, then the
// kernel command line (latchkey.verifier=, latchkey.pin=,
// latchkey.wipeStateDisk=), then these flags. An empty or zero flag
// overrides nothing; a boolean flag can only switch its setting on, so
// no flag turns off what the file or the command line asked for.
type Flags struct {
	// ConfigPath is the config file (DefaultPath unless --config).
	ConfigPath string
	// ConfigExplicit is set by --config: a missing file is then an error,
	// while a missing DefaultPath means an empty file.
	ConfigExplicit bool
	// CmdlinePath is the kernel command line (DefaultCmdlinePath unless
	// --kernel-cmdline). A missing DefaultCmdlinePath adds nothing (a
	// container without /proc); any other read error is an error, because
	// the command line may carry the verifier and its pin.
	CmdlinePath string

	Verifiers, Pins, VerifierName                            string
	Insecure, DryRun, NoJoin, KubeadmDryRun, NoReattest      bool
	Kubeadm, IgnorePreflight, Wipe                           string
	NodeName, Role, Variant, TPMDevice, DiskMode, DiskDevice string
	DiskUUID, StatusFile                                     string
	Timeout, ReattestInterval                                time.Duration
}

// configFlag is --config: setting it makes the path explicit.
type configFlag struct{ f *Flags }

func (c configFlag) String() string {
	if c.f == nil {
		return ""
	}
	return c.f.ConfigPath
}

func (c configFlag) Set(v string) error {
	c.f.ConfigPath, c.f.ConfigExplicit = v, true
	return nil
}

// Register defines the flags on fs, with their defaults.
func (f *Flags) Register(fs *flag.FlagSet) {
	f.ConfigPath = DefaultPath
	fs.Var(configFlag{f}, "config", "config `file`")
	fs.StringVar(&f.Verifiers, "verifier", "", "verifier host:port, comma-separated (overrides latchkey.verifier= and the file)")
	fs.StringVar(&f.Pins, "pin", "", "verifier SPKI pin(s) sha256:<hex>, comma-separated")
	fs.BoolVar(&f.Insecure, "insecure-skip-verifier-auth", false, "accept any verifier (lab use only)")
	fs.StringVar(&f.VerifierName, "verifier-name", "", "name a CA-pinned verifier certificate must be valid for (default: each verifier's host)")
	fs.StringVar(&f.NodeName, "node-name", "", "Kubernetes node name (default: host name)")
	fs.StringVar(&f.Role, "role", "", "worker or control-plane")
	fs.StringVar(&f.Variant, "variant", "", "evidence: tpm, snp, tdx or auto")
	fs.StringVar(&f.TPMDevice, "tpm-device", "", "TPM device or tcp://host:port of a swtpm")
	fs.StringVar(&f.DiskMode, "disk-mode", "", "luks or key-only")
	fs.StringVar(&f.DiskDevice, "disk-device", "", "state disk device")
	fs.StringVar(&f.DiskUUID, "disk-uuid", "", "disk UUID in key-only mode")
	fs.StringVar(&f.Wipe, "wipe-state-disk", "", "DESTROY data on the state disk with this serial, /dev/disk/by-id/ name or LUKS UUID, and format it")
	fs.BoolVar(&f.DryRun, "dry-run", false, "print the kubeadm JoinConfiguration (secrets redacted) instead of running kubeadm")
	fs.BoolVar(&f.KubeadmDryRun, "kubeadm-dry-run", false, "run `kubeadm join --dry-run`: real discovery, no change to this node")
	fs.StringVar(&f.Kubeadm, "kubeadm", "", "the kubeadm binary (default: kubeadm on $PATH)")
	fs.StringVar(&f.IgnorePreflight, "ignore-preflight-errors", "", "kubeadm preflight checks to ignore, comma-separated")
	fs.BoolVar(&f.NoJoin, "no-join", false, "do not join Kubernetes (disk-only machines)")
	fs.BoolVar(&f.NoReattest, "no-reattest", false, "exit after the boot instead of re-attesting (reattest.disabled)")
	fs.DurationVar(&f.ReattestInterval, "reattest-interval", 0, "re-attest this often after the boot (default 10m, jittered ±10%)")
	fs.StringVar(&f.CmdlinePath, "kernel-cmdline", DefaultCmdlinePath, "kernel command line to read latchkey.* from")
	fs.DurationVar(&f.Timeout, "timeout", 0, "give up getting a ticket after this long (default 10m)")
	fs.StringVar(&f.StatusFile, "status-file", "", "where to leave the last result for `latchkey-agent status` (default "+DefaultStatusFile+"; - keeps none)")
}

// Load reads the config file, overlays the kernel command line, then
// the flags. It does not validate: the caller runs Validate (measure
// needs less than a boot).
func (f *Flags) Load() (*Config, error) {
	cfg, err := LoadFile(f.ConfigPath, f.ConfigExplicit)
	if err != nil {
		return nil, err
	}
	cl, err := ReadKernelCmdline(f.CmdlinePath)
	switch {
	case err == nil:
		cfg.ApplyKernelCmdline(cl)
	case f.CmdlinePath == DefaultCmdlinePath && errors.Is(err, fs.ErrNotExist):
	default:
		return nil, fmt.Errorf("--kernel-cmdline %s: %w", f.CmdlinePath, err)
	}
	f.Apply(cfg)
	return cfg, nil
}

// Apply overlays the flags that were given on c.
func (f *Flags) Apply(c *Config) {
	if f.Verifiers != "" {
		c.Verifiers = strings.Split(f.Verifiers, ",")
	}
	if f.Pins != "" {
		c.VerifierPins = strings.Split(f.Pins, ",")
	}
	c.InsecureSkipVerifierAuth = c.InsecureSkipVerifierAuth || f.Insecure
	cli.Override(&c.VerifierName, f.VerifierName)
	if f.Wipe != "" {
		c.Disk.WipeStateDisk = WipeTarget(f.Wipe)
	}
	c.Join.DryRun = c.Join.DryRun || f.DryRun
	c.Join.Disabled = c.Join.Disabled || f.NoJoin
	c.Join.KubeadmDryRun = c.Join.KubeadmDryRun || f.KubeadmDryRun
	cli.Override(&c.Join.Kubeadm, f.Kubeadm)
	if f.IgnorePreflight != "" {
		c.Join.IgnorePreflightErrors = strings.Split(f.IgnorePreflight, ",")
	}
	cli.Override(&c.NodeName, f.NodeName)
	cli.Override(&c.Role, f.Role)
	cli.Override(&c.Variant, f.Variant)
	cli.Override(&c.TPM.Device, f.TPMDevice)
	cli.Override(&c.Disk.Mode, f.DiskMode)
	cli.Override(&c.Disk.Device, f.DiskDevice)
	cli.Override(&c.Disk.UUID, f.DiskUUID)
	cli.Override(&c.StatusFile, f.StatusFile)
	if f.Timeout != 0 { // a negative value is refused by Validate
		c.Timeout.Duration = f.Timeout
	}
	c.Reattest.Disabled = c.Reattest.Disabled || f.NoReattest
	if f.ReattestInterval != 0 { // below 1s is refused by Validate
		c.Reattest.Interval.Duration = f.ReattestInterval
	}
}
