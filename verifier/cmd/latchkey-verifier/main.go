// Command latchkey-verifier checks node evidence against the reference
// policy and hands out disk keys and bootstrap tokens.
//
//	latchkey-verifier serve [--config FILE] [flags]
//	latchkey-verifier pin [--config FILE]        print the serving SPKI pin
//	latchkey-verifier policy check FILE          validate a policy file
//	latchkey-verifier policy predict --uki FILE  print a UKI's reference values
//	latchkey-verifier tokens list|revoke ID      tokens minted (admin API)
//	latchkey-verifier bindings list | release --node NAME | --disk UUID
//	                                             identity bindings (admin API)
//	latchkey-verifier bindings migrate --from-dir DIR   copy a directory store into etcd
//	latchkey-verifier store check                check the etcd store (identity.etcd)
//	latchkey-verifier collateral fetch ...       fill the SNP collateral cache from AMD KDS
//	latchkey-verifier secret init FILE | id | retire --generation N
//	                                             create a master secret, print key IDs, check a retirement
//	latchkey-verifier recover-key --disk-uuid U --out FILE   break-glass: one disk's key, offline
package main

import (
	"context"
	"encoding/hex"
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

	"github.com/latchkey/latchkey/attest/snp"
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

// usageText is what --help prints.
const usageText = `usage: latchkey-verifier COMMAND [flags]

  serve [--config FILE]                      serve joins (the unit's command)
  pin [--config FILE]                        print the serving SPKI pin agents need
  policy check FILE                          validate a policy file locally
  tokens list | revoke ID                    bootstrap tokens (admin socket)
  bindings list | release --node N|--disk U  identity bindings (admin socket)
  bindings migrate --from-dir DIR            copy a directory store into identity.etcd
  store check                                connect to identity.etcd, check access, count records
  collateral fetch --chip-id HEX --tcb N     fill the SNP collateral cache from AMD KDS
  secret init [--generation N] FILE         create a master secret
  secret id                                  print the key ID of every generation
  secret retire --generation N               check no disk still needs generation N
  recover-key --disk-uuid U --out FILE|-     break-glass: one disk's key, offline
  --version                                  print the version

"latchkey-verifier COMMAND --help" lists a command's flags.`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if cli.IsVersion(args) {
		fmt.Fprintln(stdout, version.String("latchkey-verifier"))
		return exitcode.OK
	}
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintln(stdout, usageText)
		return exitcode.OK
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, usageText)
		return exitcode.BadConfig
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stderr)
	case "pin":
		return pin(args[1:], stdout, stderr)
	case "policy":
		return policyCmd(args[1:], stdout, stderr)
	case "tokens":
		return tokensCmd(args[1:], stdout, stderr)
	case "bindings":
		return bindingsCmd(args[1:], stdout, stderr)
	case "store":
		return storeCmd(args[1:], stdout, stderr) // store.go
	case "collateral":
		return collateralCmd(args[1:], stdout, stderr)
	case "secret":
		return secretCmd(args[1:], stdout, stderr)
	case "recover-key":
		return recoverKeyCmd(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "latchkey-verifier: unknown command %q\n", args[0])
		return exitcode.BadConfig
	}
}

// serveFlags override the config file.
type serveFlags struct {
	config, listen, policy, stateDir, masterSecret, salt, logLevel string
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "config file (default "+app.DefaultConfigPath+" if it exists)")
	fs.StringVar(&f.listen, "listen", "", "join address host:port (default :7443)")
	fs.StringVar(&f.policy, "policy", "", "policy file")
	fs.StringVar(&f.stateDir, "state-dir", "", "directory of the self-managed serving key")
	fs.StringVar(&f.masterSecret, "master-secret-file", "", "master secret file (default: systemd credential latchkey-master-secret)")
	fs.StringVar(&f.salt, "cluster-salt", "", "this cluster's HKDF salt")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
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

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-verifier serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	if err := cli.CheckLogLevel(f.logLevel); err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier serve:", err)
		return exitcode.BadConfig
	}
	log := logging.NewLogger(f.logLevel)
	// fail logs why serve gives up and under which exit code.
	fail := func(code int, msg string, err error) int {
		log.Error(msg, logkey.Exit, exitcode.Name(code), logkey.Error, err.Error())
		return code
	}
	cfg, err := f.load()
	if err != nil {
		return fail(exitcode.BadConfig, "bad configuration", err)
	}
	lis, err := activatedListener()
	if err != nil {
		return fail(exitcode.BadConfig, "socket activation", err)
	}
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

func pin(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-verifier pin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
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

const policyUsage = "usage: latchkey-verifier policy check FILE | policy diff [--config FILE] [--kubeconfig FILE] [--changed] | policy predict --uki FILE [--boot-loader FILE]... [--cmdline TEXT]... [--phase PHASE]... [--stub 252|254] [--secure-boot-off]"

func policyCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "predict" {
		return predictCmd(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "diff" {
		return policyDiffCmd(args[1:], stdout, stderr)
	}
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprintln(stderr, policyUsage)
		return exitcode.BadConfig
	}
	// Checked in this process: the same parser and compiler the verifier
	// loads with, without touching the running verifier's policy.
	snap, err := policy.LoadFile(args[1], policy.Deps{})
	if err != nil {
		fmt.Fprintf(stderr, "policy %s is invalid: %v\n", args[1], err)
		return exitcode.Failed
	}
	data, _ := policy.ReadFile(args[1])
	if p, err := policy.Parse(data); err == nil {
		if findings := policy.Lint(p); len(findings) > 0 {
			for _, f := range findings {
				fmt.Fprintf(stderr, "policy %s: %s\n", args[1], f)
			}
			fmt.Fprintf(stderr, "policy %s is well-formed (%s) but not fit to deploy\n", args[1], snap.Digest)
			return exitcode.Failed
		}
	}
	fmt.Fprintf(stdout, "policy %s is valid (%s), %d variant(s) enabled\n", args[1], snap.Digest, len(snap.Validators))
	return exitcode.OK
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// predictCmd prints the reference values of a UKI (and the boot loaders
// before it) as a policy snippet, with no boot: see package predict.
func predictCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-verifier policy predict", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o predict.Options
	var loaders, cmdlines, phases listFlag
	fs.StringVar(&o.UKI, "uki", "", "the unified kernel image (required)")
	fs.Var(&loaders, "boot-loader", "an EFI application loaded before the UKI (repeatable)")
	fs.Var(&cmdlines, "cmdline", "a command line the boot loader passes to the UKI (repeatable)")
	fs.Var(&phases, "phase", "a boot phase to predict pcr 11 for (repeatable; default the agent's phases)")
	stub := fs.String("stub", string(predict.Stub252), "systemd-stub generation in the UKI: 252 or 254")
	fs.BoolVar(&o.SecureBootOff, "secure-boot-off", false, "admit machines with Secure Boot off")
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 || o.UKI == "" {
		fmt.Fprintln(stderr, policyUsage)
		return exitcode.BadConfig
	}
	o.BootLoaders, o.Cmdlines, o.Phases, o.Stub = loaders, cmdlines, phases, predict.Stub(*stub)
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

func tokensCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-verifier tokens", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", localapi.VerifierSocket, "the verifier's admin socket")
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: latchkey-verifier tokens list | revoke ID")
		return exitcode.BadConfig
	}
	sub := args[0]
	if code, ok := cli.Parse(fs, args[1:]); !ok {
		return code
	}
	conn, err := localapi.Dial(*socket)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier tokens:", err)
		return exitcode.Failed
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := adminv1.NewVerifierAdminClient(conn)
	switch {
	case sub == "list" && fs.NArg() == 0:
		resp, err := c.ListTokens(ctx, &adminv1.ListTokensRequest{})
		if err == nil {
			err = adminapi.WriteTokens(stdout, resp.GetTokens(), time.Now())
			adminapi.WriteSkipped(stderr, resp.GetSkipped())
		}
		return report(stderr, err)
	case sub == "revoke" && fs.NArg() == 1:
		_, err := c.RevokeToken(ctx, &adminv1.RevokeTokenRequest{Id: fs.Arg(0)})
		if err == nil {
			fmt.Fprintf(stdout, "token %s revoked\n", fs.Arg(0))
		}
		return report(stderr, err)
	}
	fmt.Fprintln(stderr, "usage: latchkey-verifier tokens list | revoke ID")
	return exitcode.BadConfig
}

func report(stderr io.Writer, err error) int { return reportAs(stderr, "tokens", err) }

func reportAs(stderr io.Writer, cmd string, err error) int {
	if err != nil {
		fmt.Fprintf(stderr, "latchkey-verifier %s: %v\n", cmd, err)
		return exitcode.Failed
	}
	return exitcode.OK
}

const bindingsUsage = "usage: latchkey-verifier bindings list | release --node NAME | release --disk UUID | migrate --from-dir DIR"

// bindingsCmd lists and releases identity bindings over the admin API;
// the verifier audits a release with the caller's uid.
func bindingsCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-verifier bindings", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", localapi.VerifierSocket, "the verifier's admin socket")
	node := fs.String("node", "", "release the binding of this node name")
	disk := fs.String("disk", "", "release the binding of this disk UUID")
	if len(args) == 0 {
		fmt.Fprintln(stderr, bindingsUsage)
		return exitcode.BadConfig
	}
	sub := args[0]
	if sub == "migrate" {
		return bindingsMigrate(args[1:], stdout, stderr) // store.go
	}
	if code, ok := cli.Parse(fs, args[1:]); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, bindingsUsage)
		return exitcode.BadConfig
	}
	req := &adminv1.ReleaseBindingRequest{}
	switch {
	case sub == "list" && *node == "" && *disk == "":
	case sub == "release" && (*node == "") != (*disk == ""):
		req.Kind, req.Name = adminv1.BindingKind_BINDING_KIND_NODE, *node
		if *disk != "" {
			req.Kind, req.Name = adminv1.BindingKind_BINDING_KIND_DISK, *disk
		}
	default:
		fmt.Fprintln(stderr, bindingsUsage)
		return exitcode.BadConfig
	}
	conn, err := localapi.Dial(*socket)
	if err != nil {
		return reportAs(stderr, "bindings", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := adminv1.NewVerifierAdminClient(conn)
	if sub == "list" {
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

// collateralCmd fetches one chip's VCEK (and its product's ASK/ARK) from
// AMD KDS into the offline cache, honouring KDS rate limits. It is the
// only command that uses the network; the join path never does.
func collateralCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("latchkey-verifier collateral fetch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	product := fs.String("product", "Milan", "product line: Milan, Genoa or Turin")
	chipHex := fs.String("chip-id", "", "chip ID (128 hex digits, from the report or the refusal)")
	tcb := fs.Uint64("tcb", 0, "reported TCB version (from the report or the refusal)")
	const usage = "usage: latchkey-verifier collateral fetch --chip-id HEX --tcb N [--product Milan] [--config FILE]"
	if len(args) == 0 || args[0] != "fetch" {
		fmt.Fprintln(stderr, usage)
		return exitcode.BadConfig
	}
	if code, ok := cli.Parse(fs, args[1:]); !ok {
		return code
	}
	chipID, err := hex.DecodeString(*chipHex)
	if err != nil || len(chipID) != 64 {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch: --chip-id must be 128 hex digits")
		return exitcode.BadConfig
	}
	cfg, err := f.loadFile()
	if err != nil || cfg.SNPCollateralDir == "" {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch: no snpCollateralDir configured", err)
		return exitcode.BadConfig
	}
	coll, err := app.NewCollateral(cfg, nil, logging.NewLogger(f.logLevel))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_, err = coll.Fetch(ctx, &snp.KDSGetter{}, *product, chipID, *tcb)
	}
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch:", err)
		return exitcode.Failed
	}
	fmt.Fprintf(stdout, "cached %s in %s\n", snp.VCEKFileName(chipID, *tcb), cfg.SNPCollateralDir)
	return exitcode.OK
}
