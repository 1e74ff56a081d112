package binding_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/etcdtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// newEtcdStore is a store of the TLS cluster c (this test's prefix),
// connected to the given members (all by default).
func newEtcdStore(t *testing.T, c *etcdtest.Cluster, timeout time.Duration, members ...*etcdtest.Member) *binding.Etcd {
	t.Helper()
	eps := c.Endpoints()
	if len(members) > 0 {
		eps = nil
		for _, m := range members {
			eps = append(eps, m.ClientURL)
		}
	}
	s, err := binding.NewEtcd(binding.EtcdConfig{Endpoints: eps, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		Prefix: "/test/", RequestTimeout: timeout, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The Store and generation contracts against a real etcd, and what is
// stored: versioned JSON under the prefix, one key per record.
func TestEtcdStore(t *testing.T) {
	c := etcdtest.StartTLS(t, 1)
	s := newEtcdStore(t, c, 0)
	testStore(t, s, "", diskU)
	testGenerationStore(t, s, diskG1, diskG2)

	resp, err := c.Client(t).Get(context.Background(), "/test/bindings/disk-"+diskU)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("raw get: %v %v", resp, err)
	}
	if v := string(resp.Kvs[0].Value); !strings.HasPrefix(v, `{"schema":1,"kind":"disk","name":"`+diskU+`"`) {
		t.Fatalf("stored value %s", v)
	}
	// A second replica (another client) sees the same records, and a
	// claim the first replica made (a verifier killed before it sent the
	// ticket) is completed by the same machine and refused to any other.
	other := newEtcdStore(t, c, 0)
	if _, err := other.Claim(context.Background(), binding.Disk, diskU, idA); err == nil {
		t.Fatal("another machine took a claimed disk")
	}
	r, _ := other.Get(context.Background(), binding.Disk, diskU)
	if _, made, err := other.ClaimGeneration(context.Background(), diskU, r.Identity, 0); err != nil || made {
		t.Fatalf("the owner's retried claim: made %v %v", made, err)
	}
}

// An update decides on the record as it is when it writes: a write
// between its read and its compare-and-swap makes it read again.
func TestEtcdStaleRevision(t *testing.T) {
	c := etcdtest.StartTLS(t, 1)
	ctx := context.Background()
	s, replica := newEtcdStore(t, c, 0), newEtcdStore(t, c, 0)
	if _, err := s.Claim(ctx, binding.Disk, diskU, idA); err != nil {
		t.Fatal(err)
	}

	// Another replica records generation 5 after s read the record: s's
	// swap of generation 7 fails on the revision, s reads again (a second
	// swap) and writes 7 over 5.
	swaps := 0
	binding.SetEtcdBeforeSwap(s, func() {
		swaps++
		if swaps == 1 {
			if err := replica.SetKeyGeneration(ctx, diskU, idA, 5); err != nil {
				t.Error(err)
			}
		}
	})
	if err := s.SetKeyGeneration(ctx, diskU, idA, 7); err != nil || swaps != 2 {
		t.Fatalf("set generation: %v after %d swaps", err, swaps)
	}
	if r := get(t, s, diskU); *r.KeyGeneration != 7 {
		t.Fatalf("generation %d", *r.KeyGeneration)
	}

	// An operator releases the disk (on another replica) after s read it:
	// the stale swap fails, and the re-read finds it released, so nothing
	// is written over the release.
	swaps = 0
	binding.SetEtcdBeforeSwap(s, func() {
		swaps++
		if swaps == 1 {
			if _, err := replica.Release(ctx, binding.Disk, diskU, "admin"); err != nil {
				t.Error(err)
			}
		}
	})
	if err := s.SetKeyGeneration(ctx, diskU, idA, 9); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("set generation over a release: %v", err)
	}
	if r := get(t, s, diskU); r.Bound() || r.ReleasedBy != "admin" || *r.KeyGeneration != 7 {
		t.Fatalf("record after the release %+v", r)
	}
}

// Records that are not valid are skipped and reported by a listing,
// refused by a lookup and never overwritten by a claim.
func TestEtcdBadRecordsReported(t *testing.T) {
	c := etcdtest.StartTLS(t, 1)
	ctx := context.Background()
	s := newEtcdStore(t, c, 0)
	if _, err := s.Claim(ctx, binding.Disk, diskU, idA); err != nil {
		t.Fatal(err)
	}
	good, err := c.Client(t).Get(ctx, s.Key(binding.Disk, diskU))
	if err != nil {
		t.Fatal(err)
	}
	valid := string(good.Kvs[0].Value)
	disk := func(i int) string { return fmt.Sprintf("0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c%04x", i) }
	// Each value names its own key (diskU is replaced by the key's
	// disk) unless copied is set.
	cases := []struct {
		value, reason string
		copied        bool
	}{
		{`not json`, "invalid character", false},
		{strings.Replace(valid, `"schema":1`, `"schema":2`, 1), "has schema 2, not 1", false},
		{strings.Replace(valid, `"schema":1`, `"schema":1,"extra":true`, 1), `unknown field "extra"`, false},
		// A valid record copied to another disk's key: everything an
		// attacker with write access to one key controls, but the key.
		{valid, "does not name itself", true},
		{strings.Replace(valid, `"identity"`, `"keyGeneration":2147483648,"identity"`, 1), "key generation 2147483648 is over 2147483647", false},
		{`{"schema":1,"kind":"disk","name":"` + diskU + `","identity":"` + idA + `","pad":"` + strings.Repeat("x", 5000) + `"}`, "over 4096 bytes", false},
		// Released, yet naming an identity.
		{strings.Replace(valid, `"created"`, `"released":"2026-01-01T00:00:00Z","created"`, 1), "not a valid record", false},
	}
	raw := c.Client(t)
	var keys []string
	for i := range cases {
		if !cases[i].copied {
			cases[i].value = strings.ReplaceAll(cases[i].value, diskU, disk(i))
		}
		key := s.Key(binding.Disk, disk(i))
		keys = append(keys, key)
		if _, err := raw.Put(ctx, key, cases[i].value); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.List(ctx)
	skipped, rest := binding.Skipped(err)
	if err == nil || rest != nil || len(list) != 1 || list[0].Name != diskU {
		t.Fatalf("list: %+v %v", list, err)
	}
	var skippedKeys []string
	for _, r := range skipped {
		skippedKeys = append(skippedKeys, r.Key)
	}
	if strings.Join(skippedKeys, " ") != strings.Join(keys, " ") {
		t.Fatalf("skipped %v, want %v", skippedKeys, keys)
	}
	for i, tc := range cases {
		if !strings.Contains(skipped[i].Reason, tc.reason) || !strings.Contains(skipped[i].Reason, keys[i]) {
			t.Errorf("case %d: reason %q, want %q naming the key", i, skipped[i].Reason, tc.reason)
		}
		if _, err := s.Get(ctx, binding.Disk, disk(i)); err == nil || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("case %d: get: %v", i, err)
		}
		if _, err := s.Claim(ctx, binding.Disk, disk(i), idB); err == nil || !strings.Contains(err.Error(), keys[i]) {
			t.Errorf("case %d: claim: %v", i, err)
		}
		if after, _ := raw.Get(ctx, keys[i]); string(after.Kvs[0].Value) != tc.value {
			t.Errorf("case %d: the claim overwrote the bad record", i)
		}
	}
	// Generations beyond 2^31-1 are refused on write too.
	if err := s.SetKeyGeneration(ctx, diskU, idA, 1<<31); !errors.Is(err, binding.ErrInvalid) {
		t.Fatalf("generation 2^31: %v", err)
	}
	if _, _, err := s.ClaimGeneration(ctx, disk(99), idA, 1<<31); !errors.Is(err, binding.ErrInvalid) {
		t.Fatalf("claim with generation 2^31: %v", err)
	}
	if err := s.SetKeyGeneration(ctx, diskU, idA, 1<<31-1); err != nil {
		t.Fatalf("generation 2^31-1: %v", err)
	}
}

// unavailable asserts err is the store's UNAVAILABLE refusal.
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	var r *attest.Refusal
	var ue *binding.EtcdUnavailableError
	if !errors.As(err, &r) || r.Reason != latchkeyv1.Reason_UNAVAILABLE || r.Detail != binding.EtcdUnavailableDetail ||
		!errors.As(err, &ue) || ue.RetryAfter() != binding.EtcdRetryAfter {
		t.Fatalf("%s: %v, want the UNAVAILABLE refusal", what, err)
	}
}

// With two of three members down nothing is decided: a claim and a
// lookup are refused UNAVAILABLE, even through the surviving member that
// still holds the (now stale) record; both work again once a member
// returns.
func TestEtcdUnavailable(t *testing.T) {
	c := etcdtest.StartTLS(t, 3)
	ctx := context.Background()
	s := newEtcdStore(t, c, 2*time.Second)
	if _, err := s.Claim(ctx, binding.Disk, diskU, idA); err != nil {
		t.Fatal(err)
	}
	// Replicated to every member before two go (a serializable read of
	// the survivor answers from its own copy).
	survivor := c.Members[2]
	direct := c.Client(t, survivor)
	key := s.Key(binding.Disk, diskU)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := direct.Get(ctx, key, clientv3.WithSerializable())
		if err == nil && len(resp.Kvs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record not replicated to %s: %v", survivor.Name, err)
		}
	}
	c.Members[0].Kill()
	c.Members[1].Kill()
	onSurvivor := newEtcdStore(t, c, 2*time.Second, survivor)

	_, err := s.Claim(ctx, binding.Disk, diskG1, idA)
	unavailable(t, "first claim", err)
	_, err = onSurvivor.Get(ctx, binding.Disk, diskU)
	unavailable(t, "rejoin lookup", err)
	// The stale copy is there: a serializable read would have decided on it.
	if resp, err := direct.Get(ctx, key, clientv3.WithSerializable()); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("serializable read of the survivor: %v", err)
	}

	c.Members[0].Start(t)
	c.WaitReady(t, c.Members[0])
	if _, err := s.Claim(ctx, binding.Disk, diskG1, idA); err != nil {
		t.Fatalf("claim after the quorum returned: %v", err)
	}
	if r, err := onSurvivor.Get(ctx, binding.Disk, diskU); err != nil || r.Identity != idA {
		t.Fatalf("lookup after the quorum returned: %+v %v", r, err)
	}
}

// Import (migration) is idempotent and refuses a conflict naming the key.
func TestEtcdImport(t *testing.T) {
	c := etcdtest.StartTLS(t, 1)
	ctx := context.Background()
	s := newEtcdStore(t, c, 0)
	gen := uint32(2)
	r := binding.Record{Kind: binding.Disk, Name: diskU, Identity: idA, Created: time.Unix(1700000000, 0).UTC(), KeyGeneration: &gen}
	for i, want := range []bool{true, false} {
		if created, err := s.Import(ctx, r); err != nil || created != want {
			t.Fatalf("import %d: created %v %v", i, created, err)
		}
	}
	if got := get(t, s, diskU); got.Identity != idA || *got.KeyGeneration != 2 || !got.Created.Equal(r.Created) {
		t.Fatalf("imported %+v", got)
	}
	r.Identity = idB
	_, err := s.Import(ctx, r)
	var conflict *binding.ImportConflictError
	if !errors.As(err, &conflict) || conflict.Key != "/test/bindings/disk-"+diskU || conflict.Have.Identity != idA {
		t.Fatalf("conflicting import: %v", err)
	}
	if got := get(t, s, diskU); got.Identity != idA {
		t.Fatalf("a conflicting import wrote %+v", got)
	}
}

// insecure (plain HTTP, no client certificate) works against a loopback
// member; the configuration allows it nowhere else.
func TestEtcdInsecureLoopback(t *testing.T) {
	c := etcdtest.StartInsecure(t)
	s, err := binding.NewEtcd(binding.EtcdConfig{Endpoints: c.Endpoints(), Insecure: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasPrefix(c.Endpoints()[0], "http://127.0.0.1:") {
		t.Fatalf("endpoint %s", c.Endpoints()[0])
	}
	if _, err := s.Claim(context.Background(), binding.Disk, diskU, idA); err != nil {
		t.Fatal(err)
	}
	if r := get(t, s, diskU); r.Identity != idA {
		t.Fatalf("record %+v", r)
	}
}
