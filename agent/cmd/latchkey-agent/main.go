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
	"errors"
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
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logging"
	"github.com/latchkey/latchkey/internal/logkey"
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

func runBoot(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f config.Flags
	f.Register(fs)
	logLevel := registerLogLevel(fs)
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	if err := cli.CheckLogLevel(*logLevel); err != nil {
		fmt.Fprintln(stderr, "latchkey-agent:", err)
		return exitcode.BadConfig
	}
	log := logging.NewLogger(*logLevel)
	cfg, err := f.Load()
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		log.Error("bad configuration", logkey.Error, err.Error())
		if cfg != nil {
			// A status after this exit must not show an older run's result.
			leaveResult(cfg.StatusFile, app.LastResult{Result: "failed", ExitCode: exitcode.BadConfig,
				Exit: exitcode.Name(exitcode.BadConfig), Error: "bad configuration: " + err.Error(),
				Finished: time.Now().UTC(), PID: os.Getpid()}, log)
		}
		return exitcode.BadConfig
	}
	return boot(cfg, log, stdout)
}

// registerLogLevel is --log-level: how much the agent logs is not part
// of its configuration.
func registerLogLevel(fs *flag.FlagSet) *string {
	return fs.String("log-level", "info", "debug, info, warn or error")
}

func boot(cfg *config.Config, log *slog.Logger, stdout io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	notify := sdnotify.New(sdnotify.Config{Logger: log})
	state := app.NewState(cfg.NodeName, nil)
	stopAPI := serveStatus(cfg.StatusSocket, state, log)
	defer stopAPI()
	running := state.Result(exitcode.OK)
	running.Result, running.ExitCode, running.Exit = "running", 0, ""
	leaveResult(cfg.StatusFile, running, log)
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
		OnTicket:        state.Ticket,
		OnDiskCheck: func(status string, extend time.Duration) {
			_ = notify.StatusExtend(status, extend)
		},
	})
	if err != nil {
		code := exitcode.BadConfig
		if errors.Is(err, attest.ErrDevice) {
			code = exitcode.DeviceFailed // a TPM not there yet: restarted
		}
		log.Error("cannot start", logkey.Exit, exitcode.Name(code), logkey.Error, err.Error())
		state.Failed(err, code)
		leaveResult(cfg.StatusFile, state.Result(code), log)
		return code
	}
	defer a.Close()
	err = a.Boot.Run(ctx)
	code := app.ExitCode(err)
	defer func() { leaveResult(cfg.StatusFile, state.Result(code), log) }()
	if code == exitcode.Stopped {
		log.Info("stopped before the boot finished", logkey.Error, err.Error())
		state.Failed(err, code)
		return code
	}
	if err != nil {
		// One clear line in the journal says why the node did not come up.
		log.Error("boot failed", logkey.Exit, exitcode.Name(code), logkey.Error, err.Error())
		state.Failed(err, code)
		_ = notify.Status("failed: " + err.Error())
		return code
	}
	_ = notify.ReadyStatus("node ready")
	state.Ready()
	log.Info("boot complete", logkey.Node, cfg.NodeName)
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
			log.Error("cannot re-attest", logkey.Error, err.Error())
		}
		return exitcode.OK
	}
	_ = notify.Status("node ready; re-attesting")
	_ = loop.Run(ctx)
	log.Info("stopped re-attesting")
	return exitcode.OK
}

// leaveResult writes the last result for `latchkey-agent status`; "-"
// disables it. A failure is logged, not fatal: the boot's own result
// matters more.
func leaveResult(path string, r app.LastResult, log *slog.Logger) {
	if path == "-" || path == "" {
		return
	}
	if err := app.WriteLastResult(path, r); err != nil {
		log.Warn("last result not kept for latchkey-agent status", logkey.Path, path, logkey.Error, err.Error())
	}
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
		log.Warn("status API not available", logkey.Socket, path, logkey.Error, err.Error())
		return func() {}
	}
	srv, err := localapi.NewServer(localapi.Config{Services: []localapi.Service{adminapi.Service(state)}, Logger: log})
	if err != nil {
		lis.Close()
		log.Warn("status API not available", logkey.Error, err.Error())
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
	var f config.Flags
	f.Register(fs)
	registerLogLevel(fs) // accepted, as run accepts it
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	cfg, err := f.Load()
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
	file := fs.String("status-file", config.DefaultStatusFile, "the last result the agent left when it exited, read when no agent answers on the socket")
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	st, err := askAgent(*socket)
	if err == nil {
		if err := adminapi.WriteStatus(stdout, st, time.Now()); err != nil {
			return exitcode.Internal
		}
		return exitcode.OK
	}
	// No agent answers: it has exited (the unit runs it once per boot).
	last, ferr := app.ReadLastResult(*file)
	if ferr != nil {
		fmt.Fprintf(stderr, "latchkey-agent status: no agent answers on %s (%v) and it left no last result (%v)\n", *socket, err, ferr)
		return exitcode.Internal
	}
	now := time.Now()
	if last.Result == "running" {
		fmt.Fprintf(stdout, "agent: not answering: pid %d started %s ago and left no result (killed, or still starting)\n",
			last.PID, localapi.Ago(now, last.Finished.Unix()))
	} else {
		fmt.Fprintf(stdout, "agent: exited %s ago (pid %d): %s\n", localapi.Ago(now, last.Finished.Unix()), last.PID, last.Result)
	}
	if err := adminapi.WriteStatus(stdout, last.AgentStatus(), now); err != nil {
		return exitcode.Internal
	}
	return exitcode.OK
}

// askAgent asks the running agent for its status.
func askAgent(socket string) (*adminv1.AgentStatus, error) {
	conn, err := localapi.Dial(socket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return adminv1.NewAgentAdminClient(conn).Status(ctx, &adminv1.StatusRequest{})
}
