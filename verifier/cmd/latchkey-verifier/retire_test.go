package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/yamltest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/servingcert"
)

// The whole retirement, against real verifier processes in disk-only
// mode (directory store) and a software TPM: disks joined under
// generation 0; the operator adds generation 1 as current; `secret
// retire --generation 0` refuses (exit 3, in-use), listing every disk
// still on 0 and one recorded before generations were (unknown), until
// each has rejoined naming generation 1; retiring the current generation
// is refused too.
func TestSecretRetire(t *testing.T) {
	rig := newTPMRig(t)
	dir := rig.dir
	s0, s1 := filepath.Join(dir, "master.0"), filepath.Join(dir, "master.1")
	for _, s := range []string{s0, s1} {
		if code, _, errs := runCLI(t, "secret", "init", s); code != 0 {
			t.Fatal(errs)
		}
	}
	state, socket := filepath.Join(dir, "state"), filepath.Join(dir, "admin.sock")
	config := func(name string, secrets []map[string]any) string {
		return yamltest.Write(t, filepath.Join(dir, name), map[string]any{"listen": "127.0.0.1:0", "policy": rig.policy,
			"masterSecrets": secrets, "clusterSalt": "retire", "stateDir": state, "adminSocket": socket})
	}
	cfg0 := config("v0.yaml", []map[string]any{{"generation": 0, "file": s0, "current": true}})
	cfg1 := config("v1.yaml", []map[string]any{{"generation": 0, "file": s0}, {"generation": 1, "file": s1, "current": true}})

	const diskA, diskB = "6c1f0d9e-2b3a-4c5d-8e7f-9a0b1c2d3e01", "6c1f0d9e-2b3a-4c5d-8e7f-9a0b1c2d3e02"
	join := func(r *replica, disk string, rejoin bool, named *uint32) *latchkeyv1.Ticket {
		t.Helper()
		cert, err := servingcert.LoadOrCreate(state, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pins, _ := servingcert.Pins(cert)
		c, err := ticket.New(ticket.Config{Endpoints: []string{r.addr}, Pins: []atls.Pin{pins[0]}, Issuer: rig.iss,
			Timeout: 20 * time.Second, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		tk, err := c.Get(context.Background(), ticket.Request{NodeName: "node-1", DiskUUID: disk, Role: latchkeyv1.Role_ROLE_WORKER,
			Rejoin: rejoin, DiskKeyGeneration: named})
		if err != nil {
			t.Fatalf("join %s: %v", disk, err)
		}
		return tk
	}
	gen := func(n uint32) *uint32 { return &n }

	v0 := startReplica(t, cfg0)
	keyA0 := join(v0, diskA, false, nil).DiskKey
	join(v0, diskB, false, nil)
	v0.stop()
	// diskB's record as a verifier before generations wrote it.
	recFile := filepath.Join(state, "bindings", binding.ObjectName(binding.Disk, diskB))
	raw, err := os.ReadFile(recFile)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	json.Unmarshal(raw, &rec)
	if rec["keyGeneration"] != float64(0) {
		t.Fatalf("record of a first join under generation 0: %s", raw)
	}
	delete(rec, "keyGeneration")
	raw, _ = json.Marshal(rec)
	os.WriteFile(recFile, raw, 0o600)

	v1 := startReplica(t, cfg1)
	retire := func(g string) (int, string, string) {
		t.Helper()
		return runCLI(t, "secret", "retire", "--generation", g, "--socket", socket, "--config", cfg1)
	}
	code, _, errs := retire("0")
	if code != 3 || !strings.Contains(errs, "2 of 2 disk records still name generation 0 or record none; not retiring it") ||
		!strings.Contains(errs, diskA+"  0 ") || !strings.Contains(errs, diskB+"  unknown ") {
		t.Fatalf("retire 0 with both disks on it: exit %d\n%s", code, errs)
	}
	if code, _, errs := retire("1"); code != 3 || !strings.Contains(errs, "generation 1 is the current one in the configuration") {
		t.Fatalf("retire the current generation: exit %d %s", code, errs)
	}
	// diskA's header says generation 0: the ticket carries the current key
	// and generation 0's (the one the first verifier gave), for the rewrap.
	tk := join(v1, diskA, true, gen(0))
	if tk.KeyGeneration != 1 || tk.PreviousKeyGeneration != 0 || !bytes.Equal(tk.PreviousDiskKey, keyA0) || bytes.Equal(tk.DiskKey, keyA0) {
		t.Fatalf("ticket for a disk on generation 0: generation %d, previous %d", tk.KeyGeneration, tk.PreviousKeyGeneration)
	}
	// Rewrapped, it names generation 1 at its next boot.
	join(v1, diskA, true, gen(1))
	code, _, errs = retire("0")
	if code != 3 || !strings.Contains(errs, "1 of 2 disk records") || strings.Contains(errs, diskA) || !strings.Contains(errs, diskB+"  unknown ") {
		t.Fatalf("retire 0 with diskB unknown: exit %d\n%s", code, errs)
	}
	join(v1, diskB, true, gen(0))
	if code, _, errs = retire("0"); code != 3 || !strings.Contains(errs, diskB+"  0 ") {
		t.Fatalf("retire 0 with diskB on it: exit %d\n%s", code, errs)
	}
	join(v1, diskB, true, gen(1))
	code, out, errs := retire("0")
	if code != 0 || !strings.Contains(out, "no disk record (of 2) names generation 0 or lacks a generation: remove generation 0 from masterSecrets") {
		t.Fatalf("retire 0 with every disk on 1: exit %d\n%s%s", code, out, errs)
	}

	// A record that cannot be read could be a disk still on generation 0:
	// retire refuses while there is one, naming it; `bindings list` lists
	// the rest and names it too.
	badKey := binding.ObjectName(binding.Disk, "6c1f0d9e-2b3a-4c5d-8e7f-9a0b1c2d3e03")
	bad := filepath.Join(state, "bindings", badKey)
	if err := os.WriteFile(bad, []byte(`{"kind":"disk"`), 0o600); err != nil {
		t.Fatal(err)
	}
	skippedLine := "  " + badKey + ": binding: record " + bad + ": unexpected end of JSON input\n"
	code, _, errs = retire("0")
	if want := "latchkey-verifier secret retire: 1 binding record(s) cannot be read; not retiring generation 0 while any is unreadable, " +
		"since one could be a disk that still needs it. Repair or delete them, then retry:\n" + skippedLine; code != 3 || errs != want {
		t.Fatalf("retire 0 with an unreadable record: exit %d\n%s\nwant\n%s", code, errs, want)
	}
	code, out, errs = runCLI(t, "bindings", "list", "--socket", socket)
	if code != 0 || !strings.Contains(out, diskA) || !strings.Contains(out, diskB) ||
		errs != "warning: 1 unreadable record(s) left out of the listing:\n"+skippedLine {
		t.Fatalf("bindings list with an unreadable record: exit %d\n%s%s", code, out, errs)
	}
}
