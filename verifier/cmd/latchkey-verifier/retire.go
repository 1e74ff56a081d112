package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/internal/localapi"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	"github.com/latchkey/latchkey/verifier/binding"
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
	return retireVerdict(resp, gen.v, stdout, stderr)
}

// retireVerdict judges the running verifier's listing of binding
// records: generation gen may go only when every record was read (one
// that could not be could be a disk still keyed under gen) and
// binding.RetireBlockers, the store's own rule, finds no disk that names
// gen or records no generation.
func retireVerdict(resp *adminv1.ListBindingsResponse, gen uint32, stdout, stderr io.Writer) int {
	const name = "latchkey-verifier secret retire"
	if sk := resp.GetSkipped(); len(sk) > 0 {
		fmt.Fprintf(stderr, "%s: %d binding record(s) cannot be read; not retiring generation %d while any is unreadable, "+
			"since one could be a disk that still needs it. Repair or delete them, then retry:\n", name, len(sk), gen)
		for _, s := range sk {
			fmt.Fprintf(stderr, "  %s: %s\n", s.GetKey(), s.GetReason())
		}
		return exitcode.InUse
	}
	records := make([]binding.Record, 0, len(resp.GetBindings()))
	disks := 0
	for _, b := range resp.GetBindings() {
		r := bindingRecord(b)
		if r.Kind == binding.Disk {
			disks++
		}
		records = append(records, r)
	}
	blockers := binding.RetireBlockers(records, gen)
	if len(blockers) > 0 {
		fmt.Fprintf(stderr, "%s: %d of %d disk records still name generation %d or record none; not retiring it. "+
			"Each disk moves to the current generation at its next boot (and is recorded so at the one after):\n", name, len(blockers), disks, gen)
		writeBlockers(stderr, blockers)
		return exitcode.InUse
	}
	fmt.Fprintf(stdout, "no disk record (of %d) names generation %d or lacks a generation: remove generation %d from masterSecrets on every replica and restart them\n",
		disks, gen, gen)
	return exitcode.OK
}

// bindingRecord is the store record an admin API binding describes, as
// far as the retire rule reads it: a kind other than node or disk reads
// as neither (it is no disk that could need a generation).
func bindingRecord(b *adminv1.Binding) binding.Record {
	r := binding.Record{Name: b.GetName(), Identity: b.GetIdentity(), TokenID: b.GetTokenId(), ReleasedBy: b.GetReleasedBy()}
	switch b.GetKind() {
	case adminv1.BindingKind_BINDING_KIND_DISK:
		r.Kind = binding.Disk
	case adminv1.BindingKind_BINDING_KIND_NODE:
		r.Kind = binding.Node
	}
	if b.GetCreatedUnix() > 0 {
		r.Created = time.Unix(b.GetCreatedUnix(), 0)
	}
	if b.GetReleasedUnix() > 0 {
		r.Released = time.Unix(b.GetReleasedUnix(), 0)
	}
	if b.KeyGeneration != nil {
		g := b.GetKeyGeneration()
		r.KeyGeneration = &g
	}
	return r
}

func writeBlockers(w io.Writer, rs []binding.Record) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DISK\tGENERATION\tIDENTITY")
	for _, r := range rs {
		g := "unknown"
		if r.KeyGeneration != nil {
			g = fmt.Sprint(*r.KeyGeneration)
		}
		id := localapi.OrDash(r.Identity)
		if !r.Released.IsZero() {
			id = "released by " + localapi.OrDash(r.ReleasedBy)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, g, id)
	}
	tw.Flush()
}
