// Command latchkey-verifier checks node evidence against the reference
// policy and hands out disk keys and bootstrap tokens.
//
//	latchkey-verifier serve [--config FILE] [flags]   the unit's command
//	latchkey-verifier help [COMMAND]                  every command, or one command's flags
//
// The commands are the table in verifierProgram; help and each command's
// flag list are generated from it (internal/cli).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logging"
	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/internal/sdnotify"
	"github.com/latchkey/latchkey/internal/version"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	"github.com/latchkey/latchkey/verifier/adminapi"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/exitcode"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/predict"
	"github.com/latchkey/latchkey/verifier/servingcert"
)

// program is the verifier's command table: help, usage lines and every
// command's flag list come from it. (Set in init: the runners refer to it
// for their usage lines.)
var program cli.Program

func init() { program = verifierProgram() }

func verifierProgram() cli.Program {
	return cli.Program{
		Name: "latchkey-verifier",
		Commands: []cli.Command{
			{Name: "serve", Summary: "serve joins (the unit's command)", Flags: serveCmd},
			{Name: "pin", Summary: "print the serving SPKI pin agents need", Flags: pinCmd},
			{Name: "policy check", Args: "FILE", Summary: "validate a policy file locally, as the verifier would load it", Flags: policyCheckCmd},
			{Name: "policy diff", Summary: "each node's enforced decision next to the candidate policy's (Kubernetes mode)", Flags: policyDiffCmd},
			{Name: "policy predict", Summary: "print a UKI's reference values as a policy snippet", Flags: predictCmd},
			{Name: "tokens list", Summary: "bootstrap tokens minted (admin socket)", Flags: tokensCmd("list")},
			{Name: "tokens revoke", Args: "ID", Summary: "revoke a bootstrap token (admin socket)", Flags: tokensCmd("revoke")},
			{Name: "bindings list", Summary: "identity bindings (admin socket)", Flags: bindingsListCmd},
			{Name: "bindings release", Summary: "release the binding of a node name or disk UUID (admin socket)", Flags: bindingsReleaseCmd},
			{Name: "bindings migrate", Summary: "copy a directory store into identity.etcd", Flags: bindingsMigrate},
			{Name: "store check", Summary: "connect to identity.etcd, check access, count records", Flags: storeCmd},
			{Name: "collateral fetch", Summary: "fill the SNP (AMD KDS) or TDX (Intel PCS) collateral cache (the only command using the network)", Flags: collateralCmd},
			{Name: "secret init", Args: "FILE", Summary: "create a master secret", Flags: secretInit},
			{Name: "secret id", Summary: "print the key ID of every master-secret generation", Flags: secretID},
			{Name: "secret retire", Summary: "check that no disk still needs a generation", Flags: secretRetire},
			{Name: "recover-key", Summary: "break-glass: one disk's key, offline", Flags: recoverKeyCmd},
			{Name: "version", Summary: "print the version", Flags: versionCmd},
		},
		Footer: "Exit codes: docs/configuration.md, \"Exit codes\".",
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if cli.IsVersion(args) {
		return versionCmd(nil)(nil, stdout, stderr)
	}
	return program.Main(args, stdout, stderr)
}

func versionCmd(*flag.FlagSet) cli.Runner {
	return func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, version.String("latchkey-verifier"))
		return exitcode.OK
	}
}

// usageError prints name's usage line and returns the usage exit code.
func usageError(stderr io.Writer, name string) int {
	fmt.Fprintln(stderr, program.Usage(name))
	return exitcode.BadConfig
}

// serveFlags override the config file.
type serveFlags struct {
	config, listen, policy, stateDir, masterSecret, salt string
}

// register defines the named flags of the group on fs (all of them when
// none is named): each command takes only the ones it uses.
func (f *serveFlags) register(fs *flag.FlagSet, names ...string) {
	all := flag.NewFlagSet("", flag.ContinueOnError)
	all.StringVar(&f.config, "config", "", "config file (default "+app.DefaultConfigPath+" if it exists)")
	all.StringVar(&f.listen, "listen", "", "join address host:port (default :7443)")
	all.StringVar(&f.policy, "policy", "", "policy file")
	all.StringVar(&f.stateDir, "state-dir", "", "directory of the self-managed serving key")
	all.StringVar(&f.masterSecret, "master-secret-file", "", "master secret file (default: systemd credential latchkey-master-secret)")
	all.StringVar(&f.salt, "cluster-salt", "", "this cluster's HKDF salt")
	if len(names) == 0 {
		names = cli.FlagNames(all)
	}
	cli.CopyFlags(fs, all, names...)
}

func (f *serveFlags) load() (*app.Config, error) {
	cfg, err := f.loadFile()
	if err != nil {
		return nil, err
	}
	return cfg, cfg.Validate()
}

// loadFile reads the config file (if any) and applies the flags, without
// requiring what only serve needs.
func (f *serveFlags) loadFile() (*app.Config, error) {
	cfg := &app.Config{}
	path := f.config
	if path == "" {
		if _, err := os.Stat(app.DefaultConfigPath); err == nil {
			path = app.DefaultConfigPath
		}
	}
	if path != "" {
		var err error
		if cfg, err = app.LoadConfig(path); err != nil {
			return nil, err
		}
	}
	cli.Override(&cfg.Listen, f.listen)
	cli.Override(&cfg.Policy, f.policy)
	cli.Override(&cfg.StateDir, f.stateDir)
	cli.Override(&cfg.MasterSecretFile, f.masterSecret)
	cli.Override(&cfg.ClusterSalt, f.salt)
	cfg.Defaults()
	return cfg, nil
}

func serveCmd(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs)
	lf := cli.RegisterLogFlags(fs)
	return func(args []string, _, stderr io.Writer) int {
		if len(args) != 0 {
			return usageError(stderr, "serve")
		}
		return serve(&f, lf, stderr)
	}
}

func serve(f *serveFlags, lf *cli.LogFlags, stderr io.Writer) int {
	cfg, cfgErr := f.load()
	var fileLog logging.Config
	if cfg != nil {
		fileLog = cfg.Log
	}
	logCfg, err := lf.Resolve(fileLog)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier serve:", err)
		return exitcode.BadConfig
	}
	log := logging.New(logCfg)
	// fail logs why serve gives up and under which exit code.
	fail := func(code int, msg string, err error) int {
		log.Error(msg, logkey.Exit, exitcode.Name(code), logkey.Error, err.Error())
		return code
	}
	if cfgErr != nil {
		return fail(exitcode.BadConfig, "bad configuration", cfgErr)
	}
	lis, err := activatedListener()
	if err != nil {
		return fail(exitcode.BadConfig, "socket activation", err)
	}
	app.ReserveGCHeadroom()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	notify := sdnotify.New(sdnotify.Config{Logger: log})
	v, err := app.New(cfg, app.Deps{Logger: log, Listener: lis, Ready: func() { _ = notify.Ready() }})
	if errors.Is(err, app.ErrConfig) {
		return fail(exitcode.BadConfig, "cannot start", err)
	}
	if err != nil {
		return fail(exitcode.Failed, "cannot start", err)
	}
	go func() {
		if err := notify.Watchdog(ctx, v.Healthy); err != nil {
			log.Error("watchdog", logkey.Error, err.Error())
		}
	}()
	go func() { <-ctx.Done(); _ = notify.Stopping() }()
	if err := v.Serve(ctx); errors.Is(err, app.ErrConfig) {
		// A listener that cannot be bound: restarting cannot free it.
		return fail(exitcode.BadConfig, "cannot serve", err)
	} else if err != nil {
		return fail(exitcode.Failed, "serve failed", err)
	}
	return exitcode.OK
}

// activatedListener returns the socket systemd passed as "join"
// (latchkey-verifier.socket), or nil to listen on the configured address.
func activatedListener() (net.Listener, error) {
	socks, err := sdnotify.TakeSockets()
	if err != nil {
		return nil, err
	}
	defer socks.Close()
	return socks.One("join")
}

func pinCmd(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs, "config", "state-dir")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			return usageError(stderr, "pin")
		}
		return pin(&f, stdout, stderr)
	}
}

func pin(f *serveFlags, stdout, stderr io.Writer) int {
	cfg, err := f.loadFile()
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier pin:", err)
		return exitcode.BadConfig
	}
	c, err := app.ServingCertificate(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier pin:", err)
		return exitcode.Failed
	}
	pins, err := servingcert.Pins(c)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier pin:", err)
		return exitcode.Failed
	}
	// The leaf's pin. With a configured CA-signed chain an operator may
	// pin the CA instead; `openssl` prints its SPKI like any other.
	fmt.Fprintln(stdout, pins[0].String())
	return exitcode.OK
}

func policyCheckCmd(*flag.FlagSet) cli.Runner {
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 1 {
			return usageError(stderr, "policy check")
		}
		return policyCheck(args[0], stdout, stderr)
	}
}

// policyCheck validates one policy file.
func policyCheck(file string, stdout, stderr io.Writer) int {
	// Checked in this process: the same parser and compiler the verifier
	// loads with, without touching the running verifier's policy.
	snap, err := policy.LoadFile(file, policy.Deps{})
	if err != nil {
		fmt.Fprintf(stderr, "policy %s is invalid: %v\n", file, err)
		return exitcode.Failed
	}
	data, _ := policy.ReadFile(file)
	if p, err := policy.Parse(data); err == nil {
		if findings := policy.Lint(p); len(findings) > 0 {
			for _, f := range findings {
				fmt.Fprintf(stderr, "policy %s: %s\n", file, f)
			}
			fmt.Fprintf(stderr, "policy %s is well-formed (%s) but not fit to deploy\n", file, snap.Digest)
			return exitcode.Failed
		}
	}
	fmt.Fprintf(stdout, "policy %s is valid (%s), %d variant(s) enabled, %s\n", file, snap.Digest, len(snap.Validators), snap.OfflineSummary())
	return exitcode.OK
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// predictCmd prints the reference values of a UKI (and the boot loaders
// before it) as a policy snippet, with no boot: see package predict.
// --variant tdx predicts the tdx section (predict.PredictTDX), its RTMRs
// from a reference boot's CC event log.
func predictCmd(fs *flag.FlagSet) cli.Runner {
	var o predict.Options
	var loaders, cmdlines, phases listFlag
	fs.StringVar(&o.UKI, "uki", "", "the unified kernel image (required)")
	fs.Var(&loaders, "boot-loader", "an EFI application loaded before the UKI (repeatable)")
	fs.Var(&cmdlines, "cmdline", "a command line the boot loader passes to the UKI (repeatable)")
	fs.Var(&phases, "phase", "a boot phase to predict pcr 11 for (repeatable; default the agent's phases; tpm only)")
	stub := fs.String("stub", string(predict.Stub252), "systemd-stub generation in the UKI: 252 or 254")
	fs.BoolVar(&o.SecureBootOff, "secure-boot-off", false, "admit machines with Secure Boot off")
	variant := fs.String("variant", "tpm", "the policy section to predict: tpm or tdx")
	refCCEL := fs.String("reference-ccel", "", "tdx: the CC event log of a reference boot (its /sys/firmware/acpi/tables/data/CCEL), to predict RTMR[0..2]")
	refQuote := fs.String("reference-quote", "", "tdx: a TD quote of that reference boot, whose MRTD is listed")
	judge := fs.Bool("judge-rtmrs", false, "tdx: have tdx.boot judge RTMR[1] and RTMR[2] (boot.judgedRTMRs) instead of listing their values")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 || o.UKI == "" || (*variant != "tpm" && *variant != "tdx") ||
			(*variant == "tpm" && (*refCCEL != "" || *refQuote != "" || *judge)) || (*variant == "tdx" && len(phases) > 0) {
			return usageError(stderr, "policy predict")
		}
		if *variant == "tdx" {
			return predictTDXRun(predict.TDXOptions{
				UKI: o.UKI, BootLoaders: loaders, Cmdlines: cmdlines, Stub: predict.Stub(*stub),
				SecureBootOff: o.SecureBootOff, ReferenceCCEL: *refCCEL, ReferenceQuote: *refQuote,
				JudgeRTMRs: *judge,
			}, stdout, stderr)
		}
		return predictRun(o, loaders, cmdlines, phases, *stub, stdout, stderr)
	}
}

func predictRun(o predict.Options, loaders, cmdlines, phases listFlag, stub string, stdout, stderr io.Writer) int {
	o.BootLoaders, o.Cmdlines, o.Phases, o.Stub = loaders, cmdlines, phases, predict.Stub(stub)
	s, u, err := predict.Predict(o)
	if err == nil {
		err = predict.Write(stdout, s, u)
	}
	if err != nil {
		fmt.Fprintf(stderr, "latchkey-verifier: %v\n", err)
		return exitcode.Failed
	}
	return exitcode.OK
}

func predictTDXRun(o predict.TDXOptions, stdout, stderr io.Writer) int {
	s, u, err := predict.PredictTDX(o)
	if err == nil {
		err = predict.WriteTDX(stdout, s, u)
	}
	if err != nil {
		fmt.Fprintf(stderr, "latchkey-verifier: %v\n", err)
		return exitcode.Failed
	}
	return exitcode.OK
}

// tokensCmd is `tokens list` and `tokens revoke ID` over the admin API.
func tokensCmd(sub string) func(fs *flag.FlagSet) cli.Runner {
	return func(fs *flag.FlagSet) cli.Runner {
		socket := fs.String("socket", localapi.VerifierSocket, "the verifier's admin socket")
		return func(args []string, stdout, stderr io.Writer) int {
			if (sub == "list") != (len(args) == 0) {
				return usageError(stderr, "tokens "+sub)
			}
			return tokens(*socket, sub, args, stdout, stderr)
		}
	}
}

func tokens(socket, sub string, args []string, stdout, stderr io.Writer) int {
	conn, err := localapi.Dial(socket)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier tokens:", err)
		return exitcode.Failed
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := adminv1.NewVerifierAdminClient(conn)
	if sub == "list" {
		resp, err := c.ListTokens(ctx, &adminv1.ListTokensRequest{})
		if err == nil {
			err = adminapi.WriteTokens(stdout, resp.GetTokens(), time.Now())
			adminapi.WriteSkipped(stderr, resp.GetSkipped())
		}
		return report(stderr, err)
	}
	_, err = c.RevokeToken(ctx, &adminv1.RevokeTokenRequest{Id: args[0]})
	if err == nil {
		fmt.Fprintf(stdout, "token %s revoked\n", args[0])
	}
	return report(stderr, err)
}

func report(stderr io.Writer, err error) int { return reportAs(stderr, "tokens", err) }

func reportAs(stderr io.Writer, cmd string, err error) int {
	if err != nil {
		fmt.Fprintf(stderr, "latchkey-verifier %s: %v\n", cmd, err)
		return exitcode.Failed
	}
	return exitcode.OK
}

func bindingsListCmd(fs *flag.FlagSet) cli.Runner {
	socket := fs.String("socket", localapi.VerifierSocket, "the verifier's admin socket")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			return usageError(stderr, "bindings list")
		}
		return bindings(*socket, nil, stdout, stderr)
	}
}

// bindingsReleaseCmd releases one binding; the verifier audits it with
// the caller's uid.
func bindingsReleaseCmd(fs *flag.FlagSet) cli.Runner {
	socket := fs.String("socket", localapi.VerifierSocket, "the verifier's admin socket")
	node := fs.String("node", "", "release the binding of this node name")
	disk := fs.String("disk", "", "release the binding of this disk UUID")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 || (*node == "") == (*disk == "") {
			fmt.Fprintln(stderr, program.Usage("bindings release")+" (one of --node NAME or --disk UUID)")
			return exitcode.BadConfig
		}
		req := &adminv1.ReleaseBindingRequest{Kind: adminv1.BindingKind_BINDING_KIND_NODE, Name: *node}
		if *disk != "" {
			req.Kind, req.Name = adminv1.BindingKind_BINDING_KIND_DISK, *disk
		}
		return bindings(*socket, req, stdout, stderr)
	}
}

// bindings lists the bindings (req nil) or releases one over the admin API.
func bindings(socket string, req *adminv1.ReleaseBindingRequest, stdout, stderr io.Writer) int {
	conn, err := localapi.Dial(socket)
	if err != nil {
		return reportAs(stderr, "bindings", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := adminv1.NewVerifierAdminClient(conn)
	if req == nil {
		resp, err := c.ListBindings(ctx, &adminv1.ListBindingsRequest{})
		if err == nil {
			err = adminapi.WriteBindings(stdout, resp.GetBindings(), time.Now())
			adminapi.WriteSkipped(stderr, resp.GetSkipped())
		}
		return reportAs(stderr, "bindings", err)
	}
	resp, err := c.ReleaseBinding(ctx, req)
	if err == nil {
		fmt.Fprintf(stdout, "released %s %s (was bound to %s); the next machine to join with it takes it\n",
			strings.TrimPrefix(strings.ToLower(req.GetKind().String()), "binding_kind_"), req.GetName(), resp.GetReleased().GetIdentity())
	}
	return reportAs(stderr, "bindings", err)
}
