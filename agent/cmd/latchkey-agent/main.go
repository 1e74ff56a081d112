// Command latchkey-agent proves this machine to a latchkey verifier at
// boot, opens the state disk with the key it receives, and joins the
// Kubernetes cluster.
//
//	latchkey-agent [run] [flags]   one boot (the systemd unit's command)
//	latchkey-agent measure         print this machine's reference values
//	latchkey-agent status [--json] ask the running agent where it stands
//	latchkey-agent help [COMMAND]  every command, or one command's flags
//
// Exit codes are documented in agent/exitcode.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
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

// program is the agent's command table: help, usage lines and every
// command's flag list come from it.
// (Set in init: the runners refer to it for their usage lines.)
var program cli.Program

func init() { program = agentProgram() }

func agentProgram() cli.Program {
	return cli.Program{
		Name:    "latchkey-agent",
		Default: "run",
		Commands: []cli.Command{
			{Name: "run", Summary: "one boot: attest, open the state disk, join (the unit's command; the default)", Flags: runFlags},
			{Name: "measure", Summary: "print this machine's reference values as a policy snippet", Flags: measureFlags},
			{Name: "status", Summary: "where the running agent stands, or how its last boot ended (exit 1 unless running or ready)", Flags: statusFlags},
			{Name: "version", Summary: "print the version", Flags: versionFlags},
		},
		Footer: "Exit codes: docs/configuration.md, \"Exit codes\".",
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	if cli.IsVersion(args) {
		return versionFlags(nil)(nil, stdout, stderr)
	}
	return program.Main(args, stdout, stderr)
}

func versionFlags(*flag.FlagSet) cli.Runner {
	return func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, version.String("latchkey-agent"))
		return exitcode.OK
	}
}

func runFlags(fs *flag.FlagSet) cli.Runner {
	var f config.Flags
	f.Register(fs)
	lf := cli.RegisterLogFlags(fs)
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			fmt.Fprintf(stderr, "%s: unexpected argument %q\n", program.Usage("run"), args[0])
			return exitcode.BadConfig
		}
		return runBoot(&f, lf, stdout, stderr)
	}
}

func runBoot(f *config.Flags, lf *cli.LogFlags, stdout, stderr io.Writer) int {
	cfg, err := f.Load()
	if err == nil {
		err = cfg.Validate()
	}
	var fileLog logging.Config
	if cfg != nil {
		fileLog = cfg.Log
	}
	logCfg, lerr := lf.Resolve(fileLog)
	if lerr != nil {
		fmt.Fprintln(stderr, "latchkey-agent:", lerr)
		return exitcode.BadConfig
	}
	log := logging.New(logCfg)
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

func boot(cfg *config.Config, log *slog.Logger, stdout io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	notify := sdnotify.New(sdnotify.Config{Logger: log})
	state := app.NewState(cfg.NodeName, nil)
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
	// After BuildAgent, whose issuer sends the boot's first TPM command:
	// nothing the status needs may delay it.
	side := startSide(cfg, state, log)
	defer func() { side()() }()
	defer a.Close()
	err = a.Boot.Run(ctx)
	code := app.ExitCode(err)
	defer func() { side(); leaveResult(cfg.StatusFile, state.Result(code), log) }()
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
	line := readyLine(a)
	_ = notify.ReadyStatus(line)
	state.ReadyLine(line)
	log.Info("boot complete", logkey.Node, cfg.NodeName)
	return keepAttesting(ctx, a, plan, notify, state, log)
}

// startSide serves the status API and leaves the "running" result beside
// the boot, once the issuer has sent its first TPM command: that command
// needs neither, and building the API's gRPC server and the result's
// synced write (the file, then its directory) before it, or in a thread
// competing with it for a CPU, would delay it. The returned func waits
// until both are done and gives the API's stop function; every later
// result waits for it first, so "running" never overwrites how the boot
// ended.
func startSide(cfg *config.Config, state *app.State, log *slog.Logger) func() func() {
	running := state.Result(exitcode.OK)
	running.Result, running.ExitCode, running.Exit = "running", 0, ""
	done := make(chan func(), 1)
	go func() {
		stop := serveStatus(cfg.StatusSocket, state, log)
		leaveResult(cfg.StatusFile, running, log)
		done <- stop
	}()
	return sync.OnceValue(func() func() { return <-done })
}

// readyLine is the status line of a booted node: an offline boot says so,
// with how much of its grant is left, until a verifier attests it.
func readyLine(a *app.Agent) string {
	if st, ok := a.Boot.OfflineStatus(); ok {
		line := "node ready; " + bootpkg.OfflineLine(st)
		if a.CordonedOffline() {
			line += "; cordoned while offline"
		}
		return line
	}
	return "node ready"
}

// keepAttesting runs the re-attestation loop until SIGTERM; a loop that
// cannot be built is logged and the agent exits 0 (the boot succeeded).
func keepAttesting(ctx context.Context, a *app.Agent, plan disk.Plan, notify *sdnotify.Notifier, state *app.State, log *slog.Logger) int {
	loop, err := a.Reattest(plan, func(n int, r reattest.Result, _ error) {
		line := readyLine(a)
		state.ReadyLine(line) // an offline boot's line ends with its first re-attestation
		_ = notify.Status(fmt.Sprintf("%s; re-attestation %d: %s", line, n, r))
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

// measureFlags takes only what reading this machine's values needs: the
// TPM and the evidence variant, never a boot's flags (none of which,
// like --wipe-state-disk, measure would honour).
func measureFlags(fs *flag.FlagSet) cli.Runner {
	var f config.Flags
	all := flag.NewFlagSet("", flag.ContinueOnError)
	f.Register(all)
	cli.CopyFlags(fs, all, "config", "variant", "tpm-device", "kernel-cmdline")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			fmt.Fprintf(stderr, "%s: unexpected argument %q\n", program.Usage("measure"), args[0])
			return exitcode.BadConfig
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
}

// StatusNotReady is status's exit code when the agent is neither running
// nor ended its last boot ready (failed, killed, or nothing known), so a
// script or a health check can test it.
const StatusNotReady = 1

func statusFlags(fs *flag.FlagSet) cli.Runner {
	socket := fs.String("socket", localapi.AgentSocket, "the agent's status socket")
	file := fs.String("status-file", config.DefaultStatusFile, "the last result the agent left when it exited, read when no agent answers on the socket")
	asJSON := fs.Bool("json", false, "print one JSON object (fields in docs/configuration.md, \"latchkey-agent status\")")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			fmt.Fprintf(stderr, "%s: unexpected argument %q\n", program.Usage("status"), args[0])
			return exitcode.BadConfig
		}
		return runStatus(*socket, *file, *asJSON, stdout, stderr)
	}
}

func runStatus(socket, file string, asJSON bool, stdout, stderr io.Writer) int {
	now := time.Now()
	st, err := askAgent(socket)
	if err == nil {
		rep := newStatusReport("running", st, nil)
		if asJSON {
			return writeJSON(stdout, rep)
		}
		if err := adminapi.WriteStatus(stdout, st, now); err != nil {
			return exitcode.Internal
		}
		return rep.exitCode()
	}
	// No agent answers: it has exited (the unit runs it once per boot).
	last, ferr := app.ReadLastResult(file)
	if ferr != nil {
		fmt.Fprintf(stderr, "latchkey-agent status: no agent answers on %s (%v) and it left no last result (%v)\n", socket, err, ferr)
		if asJSON {
			writeJSON(stdout, statusReport{Source: "none", Result: "unknown", Error: ferr.Error()})
		}
		return StatusNotReady
	}
	result := last.Result
	if result == "running" {
		result = "not-answering" // killed, or still starting
	}
	rep := newStatusReport(result, last.AgentStatus(), last)
	if asJSON {
		return writeJSON(stdout, rep)
	}
	if last.Result == "running" {
		fmt.Fprintf(stdout, "agent: not answering: pid %d started %s ago and left no result (killed, or still starting)\n",
			last.PID, localapi.Ago(now, last.Finished.Unix()))
	} else {
		fmt.Fprintf(stdout, "agent: exited %s ago (pid %d): %s\n", localapi.Ago(now, last.Finished.Unix()), last.PID, last.Result)
	}
	if err := adminapi.WriteStatus(stdout, last.AgentStatus(), now); err != nil {
		return exitcode.Internal
	}
	return rep.exitCode()
}

// statusReport is `status --json`. Its field names are a stable interface
// (documented in docs/configuration.md); new fields may be added, none
// renamed.
type statusReport struct {
	// Source is "agent" (the running agent answered), "last-result"
	// (the file the exited agent left) or "none".
	Source string `json:"source"`
	// Result is "running", "ready", "failed", "stopped", "not-answering"
	// or "unknown".
	Result string `json:"result"`
	// Stage is the boot stage (starting ... ready, failed).
	Stage          string `json:"stage,omitempty"`
	StageSince     string `json:"stageSince,omitempty"`
	ExitCode       int    `json:"exitCode"`
	Exit           string `json:"exit,omitempty"`
	Node           string `json:"node,omitempty"`
	DiskUUID       string `json:"diskUUID,omitempty"`
	Rejoin         bool   `json:"rejoin"`
	Variant        string `json:"variant,omitempty"`
	Verifier       string `json:"verifier,omitempty"`
	Attempt        uint32 `json:"attempt"`
	EvidenceDigest string `json:"evidenceDigest,omitempty"`
	TokenID        string `json:"tokenID,omitempty"`
	Reason         string `json:"reason,omitempty"`
	Error          string `json:"error,omitempty"`
	Status         string `json:"status,omitempty"`
	PID            int    `json:"pid,omitempty"`
	// Ready is the exit-code decision: running, or the last boot ended
	// ready.
	Ready bool `json:"ready"`
}

func newStatusReport(result string, st *adminv1.AgentStatus, last *app.LastResult) statusReport {
	r := statusReport{Source: "agent", Result: result,
		Stage:    strings.ToLower(strings.TrimPrefix(st.GetStage().String(), "STAGE_")),
		ExitCode: int(st.GetExitCode()), Node: st.GetNodeName(), DiskUUID: st.GetDiskUuid(), Rejoin: st.GetRejoin(),
		Verifier: st.GetVerifierEndpoint(), Attempt: st.GetAttempt(), EvidenceDigest: st.GetEvidenceDigest(),
		TokenID: st.GetTokenId(), Error: st.GetLastError(), Status: st.GetStatusLine()}
	if st.GetStageSinceUnix() > 0 {
		r.StageSince = time.Unix(st.GetStageSinceUnix(), 0).UTC().Format(time.RFC3339)
	}
	if v := st.GetVariant(); v != 0 {
		r.Variant = strings.ToLower(strings.TrimPrefix(v.String(), "VARIANT_"))
	}
	if rs := st.GetLastReason(); rs != 0 {
		r.Reason = rs.String()
	}
	if last != nil {
		r.Source, r.Exit, r.PID = "last-result", last.Exit, last.PID
		if r.Reason == "" {
			r.Reason = last.Reason
		}
	}
	r.Ready = (result == "running" && st.GetStage() != adminv1.Stage_STAGE_FAILED) || result == "ready"
	return r
}

func (r statusReport) exitCode() int {
	if r.Ready {
		return exitcode.OK
	}
	return StatusNotReady
}

func writeJSON(w io.Writer, r statusReport) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return exitcode.Internal
	}
	return r.exitCode()
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
