package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/exitcode"
)

// storeCommandTimeout bounds `store check` and `bindings migrate` as a
// whole (each request has identity.etcd.requestTimeout besides).
const storeCommandTimeout = 5 * time.Minute

// storeCmd is `store check`: like `policy check` for the etcd store of
// disk-only replicas (identity.etcd). It connects with the configured
// client certificate, proves a linearizable read and a write under the
// prefix, and reports the record count; an invalid record is named and
// fails the check (exit 1).
func storeCmd(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs, "config")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			return usageError(stderr, "store check")
		}
		return storeCheck(&f, stdout, stderr)
	}
}

func storeCheck(f *serveFlags, stdout, stderr io.Writer) int {
	const name = "latchkey-verifier store check"
	s, cfg, code := openEtcd(f, name, stderr)
	if s == nil {
		return code
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), storeCommandTimeout)
	defer cancel()
	st, err := s.Check(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return exitcode.Failed
	}
	fmt.Fprintf(stdout, "etcd store: %s, prefix %s: read and write allowed, %d records\n",
		strings.Join(cfg.Identity.Etcd.Endpoints, ","), cfg.Identity.Etcd.Prefix, st.Records)
	if len(st.Skipped) > 0 {
		for _, r := range st.Skipped {
			fmt.Fprintf(stdout, "invalid record %s: %s\n", r.Key, r.Reason)
		}
		fmt.Fprintf(stderr, "%s: %d invalid record(s)\n", name, len(st.Skipped))
		return exitcode.Failed
	}
	return exitcode.OK
}

// openEtcd loads the configuration and opens its etcd store; on failure
// it reports and returns the exit code.
func openEtcd(f *serveFlags, name string, stderr io.Writer) (*binding.Etcd, *app.Config, int) {
	cfg, err := f.loadFile()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, nil, exitcode.BadConfig
	}
	log := slog.New(slog.DiscardHandler)
	s, err := app.OpenEtcdStore(cfg, app.Deps{Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, nil, exitcode.BadConfig
	}
	return s, cfg, exitcode.OK
}

// storeCause is the cause inside the store's UNAVAILABLE refusal (whose
// detail is for agents), for an operator's command.
func storeCause(err error) error {
	var r *attest.Refusal
	if errors.As(err, &r) && r.Err != nil {
		return r.Err
	}
	return err
}

// bindingsMigrate copies a directory store (identity.bindingDir of a
// single replica) into the configured etcd store. A record absent from
// etcd is created; one already there with the same binding is left
// alone, so the command can run again with the same result; one bound
// otherwise is a conflict, named, and nothing is written for it (exit
// InUse once every record was tried).
func bindingsMigrate(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs, "config")
	from := fs.String("from-dir", "", "the directory store to copy (identity.bindingDir, default <stateDir>/bindings)")
	return func(args []string, stdout, stderr io.Writer) int {
		if *from == "" || len(args) != 0 {
			fmt.Fprintln(stderr, program.Usage("bindings migrate")+" --from-dir DIR")
			return exitcode.BadConfig
		}
		return migrate(&f, *from, stdout, stderr)
	}
}

func migrate(f *serveFlags, from string, stdout, stderr io.Writer) int {
	const name = "latchkey-verifier bindings migrate"
	if st, err := os.Stat(from); err != nil || !st.IsDir() {
		fmt.Fprintf(stderr, "%s: --from-dir %s: not a directory (%v)\n", name, from, err)
		return exitcode.BadConfig
	}
	dir, err := binding.NewDir(binding.DirConfig{Dir: from, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return exitcode.Failed
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCommandTimeout)
	defer cancel()
	recs, err := dir.List(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s: read %s: %v\n", name, from, err)
		return exitcode.Failed
	}
	s, _, code := openEtcd(f, name, stderr)
	if s == nil {
		return code
	}
	defer s.Close()
	var created, present, conflicts int
	for _, r := range recs {
		made, err := s.Import(ctx, r)
		var conflict *binding.ImportConflictError
		switch {
		case errors.As(err, &conflict):
			conflicts++
			fmt.Fprintf(stderr, "%s: conflict: %s %s: %v\n", name, r.Kind, r.Name, err)
		case err != nil:
			fmt.Fprintf(stderr, "%s: %s %s: %v\n", name, r.Kind, r.Name, storeCause(err))
			return exitcode.Failed
		case made:
			created++
		default:
			present++
		}
	}
	fmt.Fprintf(stdout, "%d records in %s: %d copied, %d already in etcd, %d conflicts\n", len(recs), from, created, present, conflicts)
	if conflicts > 0 {
		return exitcode.InUse
	}
	return exitcode.OK
}
