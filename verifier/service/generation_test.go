package service_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/keys"
)

func gen(n uint32) *uint32 { return &n }

// generations serves 0 and 2, 2 current.
func generations(t *testing.T) *keys.Deriver {
	t.Helper()
	d, err := keys.NewGenerations([]keys.Secret{{Generation: 0, Bytes: bytes.Repeat([]byte{9}, 32)},
		{Generation: 2, Bytes: bytes.Repeat([]byte{8}, 32)}}, 2, []byte("test-cluster"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The ticket's disk_key is the current generation's; a Hello naming an
// older served generation also gets that one's key; the disk record holds
// the generation the Hello named (or, on a first boot, the current one).
func TestTicketGenerations(t *testing.T) {
	d := generations(t)
	want0, _ := d.DiskKeyAt(0, diskA)
	want2, _ := d.DiskKeyAt(2, diskA)
	var store binding.Store
	e := startVerifier(t, envOpt{keys: d, bindings: &store})
	c := client(t, e, &attesttest.Issuer{})
	recorded := func() *uint32 {
		t.Helper()
		r, err := store.Get(context.Background(), binding.Disk, diskA)
		if err != nil {
			t.Fatal(err)
		}
		return r.KeyGeneration
	}

	first, err := c.Get(context.Background(), worker(diskA))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.DiskKey, want2) || first.KeyGeneration != 2 || len(first.PreviousDiskKey) != 0 {
		t.Fatalf("first boot: generation %d, previous %d bytes; want the generation-2 key alone", first.KeyGeneration, len(first.PreviousDiskKey))
	}
	if g := recorded(); g == nil || *g != 2 {
		t.Fatalf("first boot recorded generation %v, want 2", g)
	}

	old := worker(diskA)
	old.Rejoin, old.DiskKeyGeneration = true, gen(0)
	tk, err := c.Get(context.Background(), old)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tk.DiskKey, want2) || tk.KeyGeneration != 2 || !bytes.Equal(tk.PreviousDiskKey, want0) || tk.PreviousKeyGeneration != 0 {
		t.Fatalf("disk on generation 0: generation %d, previous generation %d (%d bytes)", tk.KeyGeneration, tk.PreviousKeyGeneration, len(tk.PreviousDiskKey))
	}
	if g := recorded(); g == nil || *g != 0 {
		t.Fatalf("rejoin on generation 0 recorded %v, want 0 (the disk may still be on it)", g)
	}

	// A rejoin naming no generation comes from an agent that predates
	// generations (its header is generation 0) or the key-only stage: it
	// gets the current key alone and is recorded as 0, so generation 0
	// cannot be retired under it.
	legacy := worker(diskA)
	legacy.Rejoin = true
	tk, err = c.Get(context.Background(), legacy)
	if err != nil || !bytes.Equal(tk.DiskKey, want2) || tk.KeyGeneration != 2 || len(tk.PreviousDiskKey) != 0 {
		t.Fatalf("rejoin naming no generation: %v", err)
	}
	if g := recorded(); g == nil || *g != 0 {
		t.Fatalf("rejoin naming no generation recorded %v, want 0", g)
	}

	cur := worker(diskA)
	cur.Rejoin, cur.DiskKeyGeneration = true, gen(2)
	tk, err = c.Get(context.Background(), cur)
	if err != nil || !bytes.Equal(tk.DiskKey, want2) || len(tk.PreviousDiskKey) != 0 {
		t.Fatalf("disk on generation 2: %v, previous %d bytes", err, len(tk.GetPreviousDiskKey()))
	}
	if g := recorded(); g == nil || *g != 2 {
		t.Fatalf("rejoin on generation 2 recorded %v, want 2", g)
	}
}

// A Hello naming a generation the verifier does not serve is refused as
// KEY_GENERATION_RETIRED, with a detail naming it; no key leaves.
func TestRetiredGenerationRefused(t *testing.T) {
	e := startVerifier(t, envOpt{keys: generations(t)})
	c := clientOnce(t, e, &attesttest.Issuer{})
	if _, err := c.Get(context.Background(), worker(diskA)); err != nil {
		t.Fatal(err)
	}
	req := worker(diskA)
	req.Rejoin, req.DiskKeyGeneration = true, gen(1)
	tk, err := c.Get(context.Background(), req)
	var r *ticket.RefusedError
	if !errors.As(err, &r) || r.Reason != latchkeyv1.Reason_KEY_GENERATION_RETIRED || tk != nil {
		t.Fatalf("err = %v, want KEY_GENERATION_RETIRED and no ticket", err)
	}
	want := "disk " + diskA + " is keyed under master-secret generation 1, which this verifier no longer serves (it serves 0, 2); add generation 1 back to masterSecrets to open it"
	if r.Detail != want {
		t.Fatalf("detail %q\nwant   %q", r.Detail, want)
	}
	if !strings.Contains(e.logs.String(), "reason=KEY_GENERATION_RETIRED") ||
		!strings.Contains(e.logs.String(), "key_generation=1") {
		t.Fatalf("audit line lacks the reason or the disk's generation:\n%s", e.logs)
	}
}

// A re-attestation names the open disk's generation (after its rewrap),
// and the disk record follows it without waiting for the next boot.
func TestReattestRecordsGeneration(t *testing.T) {
	var store binding.Store
	e := startVerifier(t, envOpt{keys: generations(t), bindings: &store})
	c := client(t, e, &attesttest.Issuer{})
	old := worker(diskA)
	old.Rejoin, old.DiskKeyGeneration = true, gen(0)
	if _, err := c.Get(context.Background(), worker(diskA)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	re := worker(diskA)
	re.Rejoin, re.Reattest, re.DiskKeyGeneration = true, true, gen(2)
	tk, err := c.Get(context.Background(), re)
	if err != nil || len(tk.GetDiskKey()) != 0 || len(tk.GetPreviousDiskKey()) != 0 {
		t.Fatalf("re-attestation: %v", err)
	}
	r, err := store.Get(context.Background(), binding.Disk, diskA)
	if err != nil || r.KeyGeneration == nil || *r.KeyGeneration != 2 {
		t.Fatalf("disk record after the re-attestation: %+v %v, want generation 2", r, err)
	}
}
