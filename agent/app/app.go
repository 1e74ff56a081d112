// Package app assembles latchkey-agent's stages from its configuration and
// maps the outcome of a boot to the agent's documented exit codes.
// cmd/latchkey-agent only parses flags and calls it.
package app

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"time"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/internal/execx"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/protocol"
)

// Deps are what the caller provides besides the config.
type Deps struct {
	Logger *slog.Logger
	// Stdout receives the dry-run JoinConfiguration.
	Stdout io.Writer
	// OnProgress is told where the boot stands; optional.
	OnProgress func(p boot.Progress, line string)
	// OnPlan is told what the disk stage found; optional.
	OnPlan func(disk.Plan)
	// OnAttempt is told of each verifier attempt; optional.
	OnAttempt func(endpoint string, attempt int)
	// OnAttemptFailed is told why an attempt failed; optional.
	OnAttemptFailed func(err error)
	// OnTicket is told of each ticket received; optional.
	OnTicket func(ticket.Received)
	// OnDiskCheck is told a first boot's blank check's progress every few
	// seconds, with how far to extend the start timeout; optional.
	OnDiskCheck disk.Progress
}

// BuildAgent assembles the boot and what the agent runs after it
// (Agent.Reattest) from a validated config.
func BuildAgent(cfg *config.Config, deps Deps) (a *Agent, err error) {
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	issuer, err := NewIssuer(cfg, deps.Logger)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			issuer.Close()
		}
	}()
	tickets, err := newTickets(cfg, issuer, deps)
	if err != nil {
		return nil, err
	}
	d, err := newDisk(cfg, deps.Logger, deps.OnDiskCheck)
	if err != nil {
		return nil, err
	}
	joiner, err := newJoiner(cfg, deps)
	if err != nil {
		return nil, err
	}
	b, err := boot.New(boot.Config{NodeName: cfg.NodeName, Role: role(cfg.Role), Disk: d, Tickets: tickets,
		Joiner: joiner, JoinAttempts: joinAttempts(cfg), Logger: deps.Logger, OnProgress: deps.OnProgress, OnPlan: deps.OnPlan,
		Offline: newOffline(cfg, d)}) // offline.go
	if err != nil {
		return nil, err
	}
	return &Agent{Boot: b, cfg: cfg, deps: deps, issuer: issuer, Close: func() { issuer.Close() }}, nil
}

// NewIssuer picks the evidence variant: the configured one, or with
// "auto" SEV-SNP when the machine offers it and the TPM otherwise. log is
// the agent's logger (journald levels, --log-level), handed to the issuer
// so its lines go where the agent's do.
func NewIssuer(cfg *config.Config, log *slog.Logger) (attest.Issuer, error) {
	if variant(cfg) == "snp" {
		return snp.NewIssuer(snp.IssuerConfig{Logger: log})
	}
	// The issuer checks the PCR list before it opens the TPM, so a bad
	// list is a bad configuration even while the TPM is missing.
	iss, err := tpm.NewIssuer(tpm.IssuerConfig{Device: cfg.TPM.Device, PCRs: cfg.TPM.PCRs, Logs: tpmLogs(cfg)})
	if deviceUnavailable(err) {
		// Not there yet (a driver loading late, a vTPM not attached yet)
		// or not answering: a restart may find it, so this is a device
		// failure (restarted), not a bad configuration.
		return nil, fmt.Errorf("%w: %w", attest.ErrDevice, err)
	}
	if err != nil {
		return nil, err
	}
	// A TPM without a resource manager keeps what a killed agent loaded;
	// at boot the agent is its only user, so that is flushed before the
	// first attestation (the issuer's probe above loads nothing).
	if _, err := tpm.FlushStale(cfg.TPM.Device); err != nil {
		iss.Close()
		return nil, err
	}
	return iss, nil
}

// deviceUnavailable reports whether err is the TPM failing to open: the
// character device missing or refusing (*fs.PathError), or a TCP TPM not
// answering (*net.OpError).
func deviceUnavailable(err error) bool {
	var pe *fs.PathError
	var ne *net.OpError
	return err != nil && (errors.As(err, &pe) || errors.As(err, &ne))
}

// tpmLogs are the configured event-log paths.
func tpmLogs(cfg *config.Config) tpm.LogPaths {
	return tpm.LogPaths{FirmwareEventLog: cfg.TPM.FirmwareEventLog, SystemdEventLog: cfg.TPM.SystemdEventLog, PCRSignature: cfg.TPM.PCRSignature}
}

// variant resolves "auto" (or unset) to what the machine offers.
func variant(cfg *config.Config) string {
	if cfg.Variant != "auto" && cfg.Variant != "" {
		return cfg.Variant
	}
	if snp.Available() {
		return "snp"
	}
	return "tpm"
}

func newTickets(cfg *config.Config, issuer attest.Issuer, deps Deps) (*ticket.Client, error) {
	pins, err := atls.ParsePins(cfg.VerifierPins)
	if err != nil {
		return nil, err
	}
	if cfg.InsecureSkipVerifierAuth {
		deps.Logger.Warn("verifier authentication is OFF (--insecure-skip-verifier-auth): any server can hand this node a key")
	}
	return ticket.New(ticket.Config{Endpoints: cfg.Verifiers, Pins: pins,
		InsecureSkipVerifierAuth: cfg.InsecureSkipVerifierAuth, ServerName: cfg.VerifierName, Issuer: issuer,
		Timeout: cfg.Timeout.Duration, Logger: deps.Logger, OnAttempt: deps.OnAttempt,
		OnAttemptFailed: deps.OnAttemptFailed, OnTicket: deps.OnTicket})
}

func newDisk(cfg *config.Config, log *slog.Logger, progress disk.Progress) (disk.Stage, error) {
	if cfg.Disk.Mode == "key-only" {
		return disk.KeyOnly{UUID: cfg.Disk.UUID}, nil
	}
	return disk.NewLUKS(disk.LUKSConfig{
		Device: cfg.Disk.Device, PartLabel: cfg.Disk.PartLabel, WaitTimeout: cfg.Disk.WaitTimeout.Duration,
		MountPoint: cfg.Disk.MountPoint, BindMounts: cfg.Disk.BindMounts, FSType: cfg.Disk.FSType,
		WipeStateDisk: string(cfg.Disk.WipeStateDisk), BlankCheck: cfg.Disk.BlankCheck, Logger: log,
		Progress: progress,
		Runner:   execx.New(execx.Config{Logger: log}),
	})
}

// role is the configured role (config.Validate refused any other name).
func role(name string) latchkeyv1.Role {
	if r, ok := protocol.ParseRole(name); ok {
		return r
	}
	return latchkeyv1.Role_ROLE_WORKER
}

// clockBehind reports whether err is a verifier certificate that is not
// yet valid at now: this machine's clock is behind (a restart once time
// is synchronised helps), unlike an expired certificate or a wrong pin.
func clockBehind(err error, now time.Time) bool {
	var ce x509.CertificateInvalidError
	return errors.As(err, &ce) && ce.Reason == x509.Expired && ce.Cert != nil && now.Before(ce.Cert.NotBefore)
}

// ExitCode maps the outcome of a boot to the agent's exit codes.
func ExitCode(err error) int {
	var se *boot.StageError
	var refused *ticket.RefusedError
	switch {
	case err == nil:
		return exitcode.OK
	case errors.As(err, &refused) && !refused.Transient():
		return exitcode.RefusedByPolicy
	case errors.Is(err, ticket.ErrStopped):
		return exitcode.Stopped
	case clockBehind(err, time.Now()):
		return exitcode.ClockBehind
	case errors.Is(err, atls.ErrPinMismatch):
		return exitcode.VerifierNotAuthenticated
	case errors.Is(err, attest.ErrDevice):
		return exitcode.DeviceFailed
	case errors.Is(err, ticket.ErrUnreachable):
		return exitcode.VerifierUnreachable
	case errors.As(err, &se) && se.Stage == boot.StageDisk && errors.Is(err, disk.ErrHeaderWritten):
		return exitcode.DiskOpenFailed
	case errors.As(err, &se) && se.Stage == boot.StageDisk:
		return exitcode.DiskRefused
	case errors.As(err, &se) && se.Stage == boot.StageJoin:
		return exitcode.KubeadmFailed
	}
	return exitcode.Internal
}
