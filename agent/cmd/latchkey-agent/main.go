// Command latchkey-agent proves this machine to a latchkey verifier at
// boot, opens the state disk with the key it receives, and joins the
// Kubernetes cluster.
//
//	latchkey-agent [run] [flags]   one boot (the systemd unit's command)
//	latchkey-agent measure         print this machine's reference values
//	latchkey-agent status          ask the running agent where it stands
//
// Exit codes are documented in agent/exitcode.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/latchkey/latchkey/agent/adminapi"
	"github.com/latchkey/latchkey/agent/app"
	bootpkg "github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/agent/reattest"
	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logging"
	"github.com/latchkey/latchkey/internal/sdnotify"
	"github.com/latchkey/latchkey/internal/version"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if cli.IsVersion(args) {
		fmt.Fprintln(stdout, version.String("latchkey-agent"))
		return exitcode.OK
	}
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runBoot(args, stdout, stderr)
	case "measure":
		return runMeasure(args, stdout, stderr)
	case "status":
		return runStatus(args, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "latchkey-agent: unknown command %q (run, measure, status)\n", cmd)
		return exitcode.BadConfig
	}
}

// flags are the command-line overrides; they win over the kernel command
// line, which wins over the config file.
type flags struct {
	configPath                                   string
	verifiers, pins, verifierName                string
	insecure, dryRun, noJoin, kubeadmDry         bool
	noReattest                                   bool
	reattestInterval                             time.Duration
	kubeadm, ignorePreflight, wipe               string
	nodeName, role, variant, tpmDevice, diskMode string
	diskDevice, diskUUID, cmdlinePath, logLevel  string
	timeout                                      time.Duration
}

func (f *flags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.configPath, "config", config.DefaultPath, "config file")
	fs.StringVar(&f.verifiers, "verifier", "", "verifier host:port, comma-separated (overrides latchkey.verifier= and the file)")
	fs.StringVar(&f.pins, "pin", "", "verifier SPKI pin(s) sha256:<hex>, comma-separated")
	fs.BoolVar(&f.insecure, "insecure-skip-verifier-auth", false, "accept any verifier (lab use only)")
	fs.StringVar(&f.verifierName, "verifier-name", "", "name a CA-pinned verifier certificate must be valid for (default: each verifier's host)")
	fs.StringVar(&f.nodeName, "node-name", "", "Kubernetes node name (default: host name)")
	fs.StringVar(&f.role, "role", "", "worker or control-plane")
	fs.StringVar(&f.variant, "variant", "", "evidence: tpm, snp or auto")
	fs.StringVar(&f.tpmDevice, "tpm-device", "", "TPM device or tcp://host:port of a swtpm")
	fs.StringVar(&f.diskMode, "disk-mode", "", "luks or key-only")
	fs.StringVar(&f.diskDevice, "disk-device", "", "state disk device")
	fs.StringVar(&f.diskUUID, "disk-uuid", "", "disk UUID in key-only mode")
	fs.StringVar(&f.wipe, "wipe-state-disk", "", "DESTROY data on the state disk with this serial, /dev/disk/by-id/ name or LUKS UUID, and format it")
	fs.BoolVar(&f.dryRun, "dry-run", false, "print the kubeadm JoinConfiguration (secrets redacted) instead of running kubeadm")
	fs.BoolVar(&f.kubeadmDry, "kubeadm-dry-run", false, "run `kubeadm join --dry-run`: real discovery, no change to this node")
	fs.StringVar(&f.kubeadm, "kubeadm", "", "the kubeadm binary (default: kubeadm on $PATH)")
	fs.StringVar(&f.ignorePreflight, "ignore-preflight-errors", "", "kubeadm preflight checks to ignore, comma-separated")
	fs.BoolVar(&f.noJoin, "no-join", false, "do not join Kubernetes (disk-only machines)")
	fs.BoolVar(&f.noReattest, "no-reattest", false, "exit after the boot instead of re-attesting (reattest.disabled)")
	fs.DurationVar(&f.reattestInterval, "reattest-interval", 0, "re-attest this often after the boot (default 10m, jittered ±10%)")
	fs.StringVar(&f.cmdlinePath, "kernel-cmdline", "/proc/cmdline", "kernel command line to read latchkey.* from")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up getting a ticket after this long (default 10m)")
}

// load merges the sources in precedence order.
func (f *flags) load(fs *flag.FlagSet) (*config.Config, error) {
	explicit := false
	fs.Visit(func(fl *flag.Flag) { explicit = explicit || fl.Name == "config" })
	cfg, err := config.LoadFile(f.configPath, explicit)
	if err != nil {
		return nil, err
	}
	if cl, err := config.ReadKernelCmdline(f.cmdlinePath); err == nil {
		cfg.ApplyKernelCmdline(cl)
	}
	f.apply(cfg)
	return cfg, nil
}

func (f *flags) apply(c *config.Config) {
	if f.verifiers != "" {
		c.Verifiers = strings.Split(f.verifiers, ",")
	}
	if f.pins != "" {
		c.VerifierPins = strings.Split(f.pins, ",")
	}
	c.InsecureSkipVerifierAuth = c.InsecureSkipVerifierAuth || f.insecure
	if f.verifierName != "" {
		c.VerifierName = f.verifierName
	}
	if f.wipe != "" {
		c.Disk.WipeStateDisk = config.WipeTarget(f.wipe)
	}
	c.Join.DryRun = c.Join.DryRun || f.dryRun
	c.Join.Disabled = c.Join.Disabled || f.noJoin
	c.Join.KubeadmDryRun = c.Join.KubeadmDryRun || f.kubeadmDry
	override(&c.Join.Kubeadm, f.kubeadm)
	if f.ignorePreflight != "" {
		c.Join.IgnorePreflightErrors = strings.Split(f.ignorePreflight, ",")
	}
	override(&c.NodeName, f.nodeName)
	override(&c.Role, f.role)
	override(&c.Variant, f.variant)
	override(&c.TPM.Device, f.tpmDevice)
	override(&c.Disk.Mode, f.diskMode)
	override(&c.Disk.Device, f.diskDevice)
	override(&c.Disk.UUID, f.diskUUID)
	c.Reattest.Disabled = c.Reattest.Disabled || f.noReattest
	if f.reattestInterval != 0 { // below 1s is refused by Validate
		c.Reattest.Interval.Duration = f.reattestInterval
	}
	if f.timeout != 0 { // a negative value is refused by Validate
		c.Timeout.Duration = f.timeout
	}
}

func override(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

func runBoot(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f flags
	f.register(fs)
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	if err := cli.CheckLogLevel(f.logLevel); err != nil {
		fmt.Fprintln(stderr, "latchkey-agent:", err)
		return exitcode.BadConfig
	}
	log := logging.NewLogger(f.logLevel)
	cfg, err := f.load(fs)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		log.Error("bad configuration", "error", err.Error())
		return exitcode.BadConfig
	}
	return boot(cfg, log, stdout)
}

func boot(cfg *config.Config, log *slog.Logger, stdout io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	notify := sdnotify.New(sdnotify.Config{Logger: log})
	state := app.NewState(cfg.NodeName, nil)
	stopAPI := serveStatus(cfg.StatusSocket, state, log)
	defer stopAPI()
	var plan disk.Plan
	a, err := app.BuildAgent(cfg, app.Deps{Logger: log, Stdout: stdout,
		OnProgress: func(p bootpkg.Progress, line string) {
			state.Progress(p, line)
			_ = notify.Status(line)
			if p == bootpkg.DiskOpen {
				// Before kubeadm join: it restarts kubelet, which waits for us.
				_ = notify.ReadyStatus("state disk open")
			}
		},
		OnPlan: func(p disk.Plan) { plan = p; state.Plan(p) },
		OnAttempt: func(ep string, n int) {
			line := fmt.Sprintf("attesting to %s (attempt %d)", ep, n)
			state.Attempt(ep, n, line)
			_ = notify.Status(line)
		},
		OnAttemptFailed: state.AttemptFailed,
	})
	if err != nil {
		log.Error("cannot start", "error", err.Error())
		state.Failed(err, exitcode.BadConfig)
		return exitcode.BadConfig
	}
	defer a.Close()
	err = a.Boot.Run(ctx)
	code := app.ExitCode(err)
	if code == exitcode.Stopped {
		log.Info("stopped before the boot finished", "error", err.Error())
		state.Failed(err, code)
		return code
	}
	if err != nil {
		// One clear line in the journal says why the node did not come up.
		log.Error("boot failed", "exit", exitcode.Name(code), "error", err.Error())
		state.Failed(err, code)
		_ = notify.Status("failed: " + err.Error())
		return code
	}
	_ = notify.ReadyStatus("node ready")
	log.Info("boot complete", "node", cfg.NodeName)
	return keepAttesting(ctx, a, plan, notify, log)
}

// keepAttesting runs the re-attestation loop until SIGTERM; a loop that
// cannot be built is logged and the agent exits 0 (the boot succeeded).
func keepAttesting(ctx context.Context, a *app.Agent, plan disk.Plan, notify *sdnotify.Notifier, log *slog.Logger) int {
	loop, err := a.Reattest(plan, func(n int, r reattest.Result, _ error) {
		_ = notify.Status(fmt.Sprintf("node ready; re-attestation %d: %s", n, r))
	})
	if err != nil || loop == nil {
		if err != nil {
			log.Error("cannot re-attest", "error", err.Error())
		}
		return exitcode.OK
	}
	_ = notify.Status("node ready; re-attesting")
	_ = loop.Run(ctx)
	log.Info("stopped re-attesting")
	return exitcode.OK
}

// serveStatus serves the local status API while the boot runs; "-"
// disables it. A socket that cannot be opened is logged, not fatal: the
// boot matters more than its status.
func serveStatus(path string, state *app.State, log *slog.Logger) func() {
	if path == "-" {
		return func() {}
	}
	lis, err := localapi.Listen(localapi.SocketConfig{Path: path})
	if err != nil {
		log.Warn("status API not available", "socket", path, "error", err.Error())
		return func() {}
	}
	srv, err := localapi.NewServer(localapi.Config{Services: []localapi.Service{adminapi.Service(state)}, Logger: log})
	if err != nil {
		lis.Close()
		log.Warn("status API not available", "error", err.Error())
		return func() {}
	}
	go srv.Serve(lis)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Stop(ctx)
	}
}

func runMeasure(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-agent measure", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f flags
	f.register(fs)
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	cfg, err := f.load(fs)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-agent measure:", err)
		return exitcode.BadConfig
	}
	if err := app.Measure(context.Background(), cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "latchkey-agent measure:", err)
		return exitcode.Internal
	}
	return exitcode.OK
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-agent status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", localapi.AgentSocket, "the agent's status socket")
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	conn, err := localapi.Dial(*socket)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-agent status:", err)
		return exitcode.Internal
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := adminv1.NewAgentAdminClient(conn).Status(ctx, &adminv1.StatusRequest{})
	if err != nil {
		fmt.Fprintf(stderr, "latchkey-agent status: %v (is the agent running? it serves %s only while it boots)\n", err, *socket)
		return exitcode.Internal
	}
	if err := adminapi.WriteStatus(stdout, st, time.Now()); err != nil {
		return exitcode.Internal
	}
	return exitcode.OK
}
