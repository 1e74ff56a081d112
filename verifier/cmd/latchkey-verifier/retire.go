package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/internal/localapi"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	"github.com/latchkey/latchkey/verifier/exitcode"
)

// secretRetire checks, over the running verifier's admin API, that no
// disk still needs master-secret generation N (docs/operations.md,
// "Rotating the master secret"): it refuses, listing them, with exit
// code InUse while any disk record names N or records no generation at
// all (a disk from before generations were recorded may be keyed under
// any), released records included (the disk may still exist). It also
// refuses to retire the configured current generation. It changes
// nothing: once it passes, the operator removes N from every replica's
// masterSecrets.
func secretRetire(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs, "config")
	socket := fs.String("socket", localapi.VerifierSocket, "the verifier's admin socket")
	gen := &optionalUint{}
	fs.Var(gen, "generation", "the master-secret generation to retire")
	return func(args []string, stdout, stderr io.Writer) int {
		if !gen.set || len(args) != 0 {
			fmt.Fprintln(stderr, program.Usage("secret retire")+" --generation N")
			return exitcode.BadConfig
		}
		return retire(&f, *socket, gen, stdout, stderr)
	}
}

func retire(f *serveFlags, socket string, gen *optionalUint, stdout, stderr io.Writer) int {
	const name = "latchkey-verifier secret retire"
	cfg, err := f.loadFile()
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitcode.BadConfig
	}
	for _, s := range cfg.MasterSecrets {
		if s.Current && s.Generation != nil && *s.Generation == gen.v {
			fmt.Fprintf(stderr, "%s: generation %d is the current one in the configuration; make another current first\n", name, gen.v)
			return exitcode.InUse
		}
	}
	if len(cfg.MasterSecrets) == 0 && gen.v == 0 {
		fmt.Fprintf(stderr, "%s: generation 0 is the configuration's only secret (masterSecretFile); make another current first\n", name)
		return exitcode.InUse
	}
	conn, err := localapi.Dial(socket)
	if err != nil {
		return reportAs(stderr, "secret retire", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adminv1.NewVerifierAdminClient(conn).ListBindings(ctx, &adminv1.ListBindingsRequest{})
	if err != nil {
		return reportAs(stderr, "secret retire", err)
	}
	if sk := resp.GetSkipped(); len(sk) > 0 {
		fmt.Fprintf(stderr, "%s: %d binding record(s) cannot be read; not retiring generation %d while any is unreadable, "+
			"since one could be a disk that still needs it. Repair or delete them, then retry:\n", name, len(sk), gen.v)
		for _, s := range sk {
			fmt.Fprintf(stderr, "  %s: %s\n", s.GetKey(), s.GetReason())
		}
		return exitcode.InUse
	}
	blockers, disks := retireBlockers(resp.GetBindings(), gen.v)
	if len(blockers) > 0 {
		fmt.Fprintf(stderr, "%s: %d of %d disk records still name generation %d or record none; not retiring it. "+
			"Each disk moves to the current generation at its next boot (and is recorded so at the one after):\n", name, len(blockers), disks, gen.v)
		writeBlockers(stderr, blockers)
		return exitcode.InUse
	}
	fmt.Fprintf(stdout, "no disk record (of %d) names generation %d or lacks a generation: remove generation %d from masterSecrets on every replica and restart them\n",
		disks, gen.v, gen.v)
	return exitcode.OK
}

// retireBlockers returns the disk records that keep gen from being
// retired, sorted by disk UUID, and how many disk records there are.
func retireBlockers(bs []*adminv1.Binding, gen uint32) ([]*adminv1.Binding, int) {
	var out []*adminv1.Binding
	disks := 0
	for _, b := range bs {
		if b.GetKind() != adminv1.BindingKind_BINDING_KIND_DISK {
			continue
		}
		disks++
		if b.KeyGeneration == nil || b.GetKeyGeneration() == gen {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b *adminv1.Binding) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, disks
}

func writeBlockers(w io.Writer, bs []*adminv1.Binding) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DISK\tGENERATION\tIDENTITY")
	for _, b := range bs {
		g := "unknown"
		if b.KeyGeneration != nil {
			g = fmt.Sprint(b.GetKeyGeneration())
		}
		id := localapi.OrDash(b.GetIdentity())
		if b.GetReleasedUnix() > 0 {
			id = "released by " + localapi.OrDash(b.GetReleasedBy())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", b.GetName(), g, id)
	}
	tw.Flush()
}
