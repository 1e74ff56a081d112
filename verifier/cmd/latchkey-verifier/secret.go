package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/protocol"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/exitcode"
	"github.com/latchkey/latchkey/verifier/keys"
)

// secretID prints the key ID of every configured generation (the same
// IDs the running verifier logs and exports), so replicas can be compared
// without showing the secret.
func secretID(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs, "config", "master-secret-file", "cluster-salt")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			return usageError(stderr, "secret id")
		}
		d, code := deriverFromConfig("latchkey-verifier secret id", &f, stderr)
		if d == nil {
			return code
		}
		defer d.Close()
		gens := d.Generations()
		if len(gens) == 1 {
			fmt.Fprintln(stdout, gens[0].KeyID)
			return exitcode.OK
		}
		for _, g := range gens {
			mark := ""
			if g.Current {
				mark = " current"
			}
			fmt.Fprintf(stdout, "generation %d %s%s\n", g.Generation, g.KeyID, mark)
		}
		return exitcode.OK
	}
}

// secretInit creates a new master secret; --generation only shapes the
// masterSecrets entry it suggests (the bytes of every generation are made
// the same way).
func secretInit(fs *flag.FlagSet) cli.Runner {
	gen := fs.Uint("generation", 0, "the generation the new secret will be (0: a new cluster's first secret)")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 1 || *gen > keys.MaxGeneration {
			return usageError(stderr, "secret init")
		}
		return secretInitRun(args[0], *gen, stdout, stderr)
	}
}

func secretInitRun(path string, gen uint, stdout, stderr io.Writer) int {
	if err := keys.InitMasterSecret(path); err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier secret init:", err)
		return exitcode.Failed
	}
	fmt.Fprintf(stdout, "created master secret %s (%d random bytes, mode 0600); keep a copy offline: without it no disk can be opened\n",
		path, keys.MinMasterSecretSize)
	if gen > 0 {
		fmt.Fprintf(stdout, "add it to masterSecrets on every replica as {generation: %d, file: %s, current: true} "+
			"(and drop current: from the old entry); docs/operations.md, \"Rotating the master secret\"\n", gen, path)
	}
	return exitcode.OK
}

// recoverKeyCmd is break-glass recovery: it derives one disk's key offline
// from the master secret, with no attestation, for an operator restoring
// that disk's data. The key goes only to a new file (0600) or to a pipe,
// never to a terminal or a log.
func recoverKeyCmd(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs, "config", "master-secret-file", "cluster-salt")
	uuid := fs.String("disk-uuid", "", "the LUKS UUID of the disk (cryptsetup luksUUID DEVICE)")
	gen := generationFlag(fs)
	out := fs.String("out", "", "new file to write the 32-byte key to (mode 0600), or - for a pipe on stdout")
	return func(args []string, stdout, stderr io.Writer) int {
		if !protocol.ValidDiskUUID(*uuid) || *out == "" || len(args) != 0 {
			fmt.Fprintln(stderr, program.Usage("recover-key")+" --disk-uuid UUID --out FILE|- (the UUID in canonical lower-case form)")
			return exitcode.BadConfig
		}
		return recoverKey(&f, *uuid, gen, *out, stdout, stderr)
	}
}

func recoverKey(f *serveFlags, uuid string, gen *optionalUint, out string, stdout, stderr io.Writer) int {
	const name = "latchkey-verifier recover-key"
	if out == "-" && isTerminal(stdout) {
		fmt.Fprintln(stderr, name+": refusing to write a disk key to a terminal; use --out FILE or a pipe")
		return exitcode.BadConfig
	}
	d, code := deriverFromConfig(name, f, stderr)
	if d == nil {
		return code
	}
	defer d.Close()
	g, err := recoveryGeneration(d, gen)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitcode.BadConfig
	}
	key, err := d.DiskKeyAt(g, uuid)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitcode.BadConfig
	}
	defer clear(key)
	if err := writeKey(out, key, stdout); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitcode.Failed
	}
	fmt.Fprintf(stderr, "%s: derived the key of disk %s under generation %d (%s) to %s\n", name, uuid, g, d.KeyIDAt(g), out)
	return exitcode.OK
}

// deriverFromConfig reads the master secret and salt the verifier would
// serve with (config file, then flags).
func deriverFromConfig(name string, f *serveFlags, stderr io.Writer) (*keys.Deriver, int) {
	cfg, err := f.loadFile()
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return nil, exitcode.BadConfig
	}
	if cfg.ClusterSalt == "" {
		fmt.Fprintln(stderr, name+": no cluster salt configured (clusterSalt: or --cluster-salt)")
		return nil, exitcode.BadConfig
	}
	d, err := app.Deriver(cfg)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return nil, exitcode.BadConfig
	}
	return d, exitcode.OK
}

func writeKey(out string, key []byte, stdout io.Writer) error {
	if out == "-" {
		_, err := stdout.Write(key)
		return err
	}
	file, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create key file (it must not exist yet): %w", err)
	}
	if _, err := file.Write(key); err != nil {
		file.Close()
		return errors.Join(err, os.Remove(out))
	}
	return file.Close()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
