package service_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// countingStore counts the reads and claims the service makes, and
// passes ClaimGeneration through so the service claims as it does on the
// real stores.
type countingStore struct {
	binding.Store
	gets, claims atomic.Int32
}

func (c *countingStore) Get(ctx context.Context, k binding.Kind, n string) (binding.Record, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, k, n)
}

func (c *countingStore) Claim(ctx context.Context, k binding.Kind, n, id string) (binding.Record, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, k, n, id)
}

func (c *countingStore) ClaimGeneration(ctx context.Context, disk, id string, gen uint32) (binding.Record, bool, error) {
	c.claims.Add(1)
	return c.Store.(binding.GenerationClaimer).ClaimGeneration(ctx, disk, id, gen)
}

// A disk-only first join is one claim and no read: the claim alone
// refuses a disk bound to another machine (with the exact detail, the
// record untouched), gives a retried first join of the same machine its
// key, and takes a released record over.
func TestDiskOnlyFirstJoinIsOneClaim(t *testing.T) {
	cs := &countingStore{}
	pol := &swapPolicy{}
	e := startVerifier(t, envOpt{policy: pol, store: func(s binding.Store) binding.Store { cs.Store = s; return cs }})
	ctx := context.Background()
	first, err := clientOnce(t, e, &attesttest.Issuer{}).Get(ctx, worker(diskA))
	if err != nil {
		t.Fatal(err)
	}
	if g, c := cs.gets.Load(), cs.claims.Load(); g != 0 || c != 1 {
		t.Fatalf("first join: %d reads, %d claims; want 0 and 1", g, c)
	}

	// Another machine names the same disk: everything it controls (the
	// Hello) is the same, its attested identity is not.
	pol.set(t, "", "fake:other")
	_, err = clientOnce(t, e, &attesttest.Issuer{}).Get(ctx, worker(diskA))
	want := "disk " + diskA + " is bound to another machine; an operator releases it with `latchkey-verifier bindings release --disk " + diskA + "`"
	if r := refusal(t, err); r != latchkeyv1.Reason_IDENTITY_MISMATCH || !strings.Contains(err.Error(), want) {
		t.Fatalf("another machine: %v (%v), want IDENTITY_MISMATCH %q", r, err, want)
	}
	if r, err := cs.Store.Get(ctx, binding.Disk, diskA); err != nil || r.Identity != "fake:machine" {
		t.Fatalf("record after the refused claim: %+v %v", r, err)
	}

	// The first machine retries its first join: the same key.
	pol.set(t, "", "")
	again, err := clientOnce(t, e, &attesttest.Issuer{}).Get(ctx, worker(diskA))
	if err != nil || !bytes.Equal(again.DiskKey, first.DiskKey) {
		t.Fatalf("retried first join: %v (same key %v)", err, err == nil && bytes.Equal(again.DiskKey, first.DiskKey))
	}

	// Released by an operator, the disk goes to the next first join.
	if _, err := cs.Store.Release(ctx, binding.Disk, diskA, "test"); err != nil {
		t.Fatal(err)
	}
	pol.set(t, "", "fake:other")
	if _, err := clientOnce(t, e, &attesttest.Issuer{}).Get(ctx, worker(diskA)); err != nil {
		t.Fatalf("first join after the release: %v", err)
	}
	if r, err := cs.Store.Get(ctx, binding.Disk, diskA); err != nil || r.Identity != "fake:other" {
		t.Fatalf("record after the release and claim: %+v %v", r, err)
	}
}
