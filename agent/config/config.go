// Package config is the agent's configuration. Three sources, in rising
// precedence:
//
//  1. the config file (default /etc/latchkey/agent.yaml; what an image
//     builder bakes in),
//  2. the kernel command line (latchkey.verifier=, latchkey.pin=,
//     latchkey.wipeStateDisk=; what a VM's boot configuration sets per
//     machine, or an operator for one boot),
//  3. command-line flags (what an operator types).
//
// A later source replaces a list from an earlier one as a whole; it does
// not append. The zero value of every option is the secure one: no pin
// means no run unless insecureSkipVerifierAuth is set, and the state disk
// is never wiped unless wipeStateDisk names it.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logging"
	"github.com/latchkey/latchkey/internal/strictyaml"

	"github.com/latchkey/latchkey/agent/reattest"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/duration"
	"github.com/latchkey/latchkey/protocol"
)

// DefaultPath is where the agent looks for its config file.
const DefaultPath = "/etc/latchkey/agent.yaml"

// maxFileSize bounds the config file.
const maxFileSize = 1 << 20

// Config is the agent's whole configuration.
type Config struct {
	// NodeName is the Kubernetes node name (default: the host name).
	NodeName string `json:"nodeName,omitempty"`
	// Role is "worker" (default) or "control-plane".
	Role string `json:"role,omitempty"`
	// Verifiers are host:port of the verifier replicas.
	Verifiers []string `json:"verifiers,omitempty"`
	// VerifierPins are "sha256:<hex>" SPKI pins of the verifier's serving
	// certificate or of the CA that signs it.
	VerifierPins []string `json:"verifierPins,omitempty"`
	// VerifierName is the name a verifier's certificate must be valid for
	// when it is pinned through a CA (default: the host of each verifier
	// address). A pinned leaf needs no name.
	VerifierName string `json:"verifierName,omitempty"`
	// InsecureSkipVerifierAuth accepts any verifier. Lab use only.
	InsecureSkipVerifierAuth bool `json:"insecureSkipVerifierAuth,omitempty"`
	// Variant is "tpm", "snp", "tdx" or "auto" (default: what the machine
	// offers).
	Variant string    `json:"variant,omitempty"`
	TPM     TPMConfig `json:"tpm,omitempty"`
	Disk    Disk      `json:"disk,omitempty"`
	Join    Join      `json:"join,omitempty"`
	// Timeout bounds the whole ticket stage (default 10m).
	Timeout Duration `json:"timeout,omitempty"`
	// Reattest configures re-attestation after the boot.
	Reattest Reattest `json:"reattest,omitempty"`
	// Offline configures offline unlock, used only when a verifier
	// granted it (docs/offline-unlock.md).
	Offline Offline `json:"offline,omitempty"`
	// StatusSocket is the local admin API socket (default
	// /run/latchkey/agent/admin.sock; "-" disables it).
	StatusSocket string `json:"statusSocket,omitempty"`
	// StatusFile is where the agent leaves its last result when it exits,
	// for `latchkey-agent status` after the process is gone (default
	// /run/latchkey/agent/last.json; "-" disables it).
	StatusFile string `json:"statusFile,omitempty"`
	// Log sets the log level and format (log: {level, format});
	// --log-level and --log-format override it.
	Log logging.Config `json:"log,omitempty"`
}

// DefaultStatusFile is the default StatusFile, next to the status socket
// in the unit's RuntimeDirectory (which the unit preserves when it stops).
const DefaultStatusFile = "/run/latchkey/agent/last.json"

// TPMConfig selects the TPM and the PCRs to quote.
type TPMConfig struct {
	// Device is /dev/tpmrm0 (default) or tcp://host:port of a swtpm.
	Device string `json:"device,omitempty"`
	// PCRs to quote (default: the variant's default set). Every PCR the
	// event logs extend is quoted as well.
	PCRs []int `json:"pcrs,omitempty"`
	// FirmwareEventLog, SystemdEventLog and PCRSignature are where the
	// agent reads what it sends with the quote (defaults: the kernel's
	// binary_bios_measurements, /run/log/systemd/tpm2-measure.log,
	// /run/systemd/tpm2-pcr-signature.json; a missing file is not sent;
	// "-" sends none).
	FirmwareEventLog string `json:"firmwareEventLog,omitempty"`
	SystemdEventLog  string `json:"systemdEventLog,omitempty"`
	PCRSignature     string `json:"pcrSignature,omitempty"`
}

// Disk configures the state disk.
type Disk struct {
	// Mode is "luks" (default: format or unlock the state disk) or
	// "key-only" (fetch and check the key, touch no device).
	Mode string `json:"mode,omitempty"`
	// Device is the state disk: a path or a /dev/disk/by-* link.
	Device string `json:"device,omitempty"`
	// PartLabel finds the state disk by GPT partition label instead.
	PartLabel string `json:"partLabel,omitempty"`
	// UUID is the disk UUID in key-only mode.
	UUID string `json:"uuid,omitempty"`
	// MountPoint of the opened state disk.
	MountPoint string `json:"mountPoint,omitempty"`
	// BindMounts are directories kept on the state disk.
	BindMounts []string `json:"bindMounts,omitempty"`
	// FSType is ext4 (default) or xfs.
	FSType string `json:"fsType,omitempty"`
	// WipeStateDisk names the one disk the agent may destroy and format
	// although it carries data: its serial, a /dev/disk/by-id/ name or the
	// UUID of the LUKS header on it. A value that names another disk
	// destroys nothing. It exists for re-provisioning a node on purpose.
	WipeStateDisk WipeTarget `json:"wipeStateDisk,omitempty"`
	// BlankCheck is how a first boot proves the device blank before it
	// formats it: "full" (the default: every byte read and zero) or
	// "sampled" (the older sampled rule, only for state disks created
	// with the VM; docs/configuration.md states its risk).
	BlankCheck string `json:"blankCheck,omitempty"`
	// WaitTimeout bounds the wait for the device to appear (default 60s).
	WaitTimeout Duration `json:"waitTimeout,omitempty"`
}

// WipeTarget is disk.wipeStateDisk: a disk's serial, by-id name or LUKS
// UUID, written as a string. It used to be a boolean; a boolean (or any
// other non-string) is refused with what to write instead, so an old
// config cannot silently mean "wipe whatever disk is there".
type WipeTarget string

// UnmarshalJSON accepts only a JSON string (strictyaml turns YAML into
// JSON first, so `true`, `yes` and unquoted numbers arrive here as
// non-strings).
func (w *WipeTarget) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil && !yesNo(s) {
		*w = WipeTarget(s)
		return nil
	}
	if v := strings.Trim(string(b), `"`); v == "true" || v == "false" || yesNo(v) {
		return fmt.Errorf("disk.wipeStateDisk is %s, but it now names the disk it may destroy: "+
			"put that disk's serial (udevadm info --query=property --name=/dev/vdb | grep ID_SERIAL), "+
			"a /dev/disk/by-id/ name or its LUKS UUID in quotes, or remove the key", v)
	}
	return fmt.Errorf("disk.wipeStateDisk must be a quoted string (a disk serial, /dev/disk/by-id/ name or LUKS UUID), not %s", b)
}

// yesNo reports a YAML 1.1 boolean word (read as a string under YAML
// 1.2), which an operator may have meant as the old boolean.
func yesNo(s string) bool {
	switch strings.ToLower(s) {
	case "yes", "no", "on", "off", "y", "n":
		return true
	}
	return false
}

// Join configures the kubeadm join stage.
type Join struct {
	// Disabled skips kubeadm join (disk-only machines).
	Disabled bool `json:"disabled,omitempty"`
	// DryRun prints the JoinConfiguration (token secret redacted) instead
	// of running kubeadm.
	DryRun bool `json:"dryRun,omitempty"`
	// KubeadmDryRun runs `kubeadm join --dry-run`: real discovery against
	// the cluster (token, signature, CA pin), no change to this node.
	KubeadmDryRun bool `json:"kubeadmDryRun,omitempty"`
	// IgnorePreflightErrors are passed to kubeadm as they are (e.g. "all"
	// where no container runtime runs, as in the demo).
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
	// Kubeadm is the kubeadm binary (default: kubeadm on $PATH).
	Kubeadm string `json:"kubeadm,omitempty"`
	// DiscoveryTimeout for kubeadm's discovery (default 5m).
	DiscoveryTimeout Duration `json:"discoveryTimeout,omitempty"`
	// CRISocket is the container runtime's endpoint (unix:///path), given
	// to kubeadm as nodeRegistration.criSocket; kubeadm detects it when
	// empty. With it the agent waits for the runtime to listen before it
	// runs kubeadm: the runtime starts only after the agent is ready
	// (containerd.service.d/50-latchkey.conf), so without the wait kubeadm's
	// preflight would race it.
	CRISocket string `json:"criSocket,omitempty"`
	// CRIWait bounds that wait (default 2m).
	CRIWait Duration `json:"criWait,omitempty"`
}

// Reattest configures the agent's re-attestation after the boot: the
// agent stays running and proves the machine again every interval, so the
// verifier can taint a node whose measurements changed or that went
// silent.
type Reattest struct {
	// Interval between re-attestations (default 10m, jittered ±10%;
	// at least 1s).
	Interval Duration `json:"interval,omitempty"`
	// Disabled turns re-attestation off: the agent exits after the boot
	// (and a verifier that enforces reattest.deadline taints the node).
	Disabled bool `json:"disabled,omitempty"`
}

// Offline configures offline unlock on the agent. Whether a node may
// unlock offline at all is the verifier's decision (its policy's
// offlineUnlock); the agent only decides how long it waits for a
// verifier first.
type Offline struct {
	// After is how long a boot holding an offline grant tries the
	// verifiers before it unlocks offline (default: one full round of
	// the endpoints plus 5s, ticket.DefaultOfflineAfter).
	After Duration `json:"after,omitempty"`
}

// Duration is a time.Duration written as "30s" in YAML.
type Duration = duration.Duration

// LoadFile reads a config file strictly (unknown fields are errors). A
// missing file at the default path is not an error: flags and the kernel
// command line may carry everything.
func LoadFile(path string, explicit bool) (*Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return &c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("config %s is larger than %d bytes", path, maxFileSize)
	}
	if err := strictyaml.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &c, nil
}

// Validate checks the merged configuration and fills defaults.
func (c *Config) Validate() error {
	if err := c.defaults(); err != nil {
		return err
	}
	if err := c.Log.Validate(); err != nil {
		return fmt.Errorf("log: %w", err)
	}
	if len(c.Verifiers) == 0 {
		return errors.New("no verifier configured (verifiers:, latchkey.verifier= or --verifier)")
	}
	if _, err := atls.ParsePins(c.VerifierPins); err != nil {
		return err
	}
	if len(c.VerifierPins) == 0 && !c.InsecureSkipVerifierAuth {
		return errors.New("no verifier pin configured (verifierPins:, latchkey.pin= or --pin); --insecure-skip-verifier-auth accepts any verifier")
	}
	if err := c.validateEnums(); err != nil {
		return err
	}
	return c.validateLocal()
}

func (c *Config) defaults() error {
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("node name: %w", err)
		}
		// kubelet and kubeadm lower-case the host name for the node
		// name; do the same, so an upper-case host name is the same node.
		c.NodeName = strings.ToLower(h)
	}
	setDefault(&c.Role, protocol.RoleWorker)
	setDefault(&c.Variant, "auto")
	setDefault(&c.Disk.Mode, "luks")
	setDefault(&c.StatusSocket, localapi.AgentSocket)
	setDefault(&c.StatusFile, DefaultStatusFile)
	if c.Reattest.Interval.Duration == 0 {
		c.Reattest.Interval.Duration = reattest.DefaultInterval
	}
	if c.Timeout.Duration == 0 {
		c.Timeout.Duration = ticket.DefaultTimeout
	}
	if c.Offline.After.Duration == 0 {
		c.Offline.After.Duration = ticket.DefaultOfflineAfter(len(c.Verifiers))
	}
	return nil
}

func (c *Config) validateEnums() error {
	if _, ok := protocol.ParseRole(c.Role); !ok {
		return fmt.Errorf("role %q: want %s or %s", c.Role, protocol.RoleWorker, protocol.RoleControlPlane)
	}
	switch c.Variant {
	case "tpm", "snp", "tdx", "auto":
	default:
		return fmt.Errorf("variant %q: want tpm, snp, tdx or auto", c.Variant)
	}
	switch c.Disk.Mode {
	case "luks", "key-only":
	default:
		return fmt.Errorf("disk mode %q: want luks or key-only", c.Disk.Mode)
	}
	return nil
}

func setDefault(s *string, v string) {
	if *s == "" {
		*s = v
	}
}
