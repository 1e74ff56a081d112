package binding_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/latchkey/latchkey/verifier/binding"
)

const (
	idA   = "tpm-ek:sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	idB   = "tpm-ek:sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	diskU = "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e"
	// diskG1 and diskG2 are the generation contract's disks.
	diskG1 = "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d01"
	diskG2 = "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d02"
)

// testStore runs the Store contract against s; names are prefixed so the
// real control plane's runs do not collide.
func testStore(t *testing.T, s binding.Store, prefix, disk string) {
	ctx := context.Background()
	node := prefix + "node-1"

	// First claim wins; the same identity again is fine; another is a
	// mismatch naming both.
	r, err := s.Claim(ctx, binding.Node, node, idA)
	if err != nil || r.Identity != idA || r.Kind != binding.Node || r.Name != node {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if _, err := s.Claim(ctx, binding.Node, node, idA); err != nil {
		t.Fatalf("re-claim by the owner: %v", err)
	}
	_, err = s.Claim(ctx, binding.Node, node, idB)
	var mm *binding.MismatchError
	if !errors.As(err, &mm) || !errors.Is(err, binding.ErrMismatch) || mm.Bound != idA || mm.Identity != idB {
		t.Fatalf("claim by another: %v", err)
	}
	if _, err := s.Get(ctx, binding.Disk, disk); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("get of an unrecorded disk: %v", err)
	}

	// Tokens are recorded for the owner only.
	if err := s.SetToken(ctx, node, idA, "abcdef"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetToken(ctx, node, idB, "zzzzzz"); !errors.Is(err, binding.ErrMismatch) {
		t.Fatalf("token for another identity: %v", err)
	}
	if r, _ := s.Get(ctx, binding.Node, node); r.TokenID != "abcdef" {
		t.Fatalf("token %q", r.TokenID)
	}

	// Release leaves a tombstone with who released it; the next claim
	// (anyone's) takes it over; a second release is NotFound.
	got, err := s.Release(ctx, binding.Node, node, "admin uid=0 pid=1")
	if err != nil || got.Identity != idA || got.TokenID != "abcdef" {
		t.Fatalf("release: %+v %v", got, err)
	}
	if _, err := s.Release(ctx, binding.Node, node, "x"); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("second release: %v", err)
	}
	tomb, err := s.Get(ctx, binding.Node, node)
	if err != nil || tomb.Bound() || tomb.TokenID != "" || tomb.ReleasedBy != "admin uid=0 pid=1" || tomb.Released.IsZero() {
		t.Fatalf("tombstone %+v %v", tomb, err)
	}
	if err := s.SetToken(ctx, node, idA, "abcdef"); err == nil {
		t.Fatal("token recorded on a released binding")
	}
	if r, err := s.Claim(ctx, binding.Node, node, idB); err != nil || r.Identity != idB {
		t.Fatalf("claim after release: %+v %v", r, err)
	}

	// Racing claims of one new name, and of one released name: exactly
	// one identity wins, and every loser is told who.
	for round, prep := range []func(){
		func() {},
		func() {
			if _, err := s.Release(ctx, binding.Disk, disk, "test"); err != nil {
				t.Fatal(err)
			}
		},
	} {
		prep()
		const n = 8
		var wg sync.WaitGroup
		wins := make([]string, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("tpm-ek:sha256:%064x", i+round*100)
				if _, err := s.Claim(ctx, binding.Disk, disk, id); err == nil {
					wins[i] = id
				} else {
					errs[i] = err
				}
			}()
		}
		wg.Wait()
		var winner string
		for i := range n {
			switch {
			case wins[i] != "" && winner != "":
				t.Fatalf("round %d: two claims won: %s and %s", round, winner, wins[i])
			case wins[i] != "":
				winner = wins[i]
			case !errors.As(errs[i], &mm):
				t.Fatalf("round %d: a losing claim failed otherwise: %v", round, errs[i])
			}
		}
		r, err := s.Get(ctx, binding.Disk, disk)
		if winner == "" || err != nil || r.Identity != winner {
			t.Fatalf("round %d: winner %q, record %+v %v", round, winner, r, err)
		}
	}

	list, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mine int
	for _, r := range list {
		if r.Name == node || r.Name == disk {
			mine++
		}
	}
	if mine != 2 {
		t.Fatalf("list %+v", list)
	}

	// Invalid input is refused before it reaches the store.
	for _, bad := range []struct {
		kind     binding.Kind
		name, id string
	}{
		{binding.Node, "Not_A_Name", idA},
		{binding.Disk, strings.ToUpper(diskU), idA},
		{"volume", "x", idA},
		{binding.Node, prefix + "ok", ""},
		{binding.Node, prefix + "ok", "a\nb"},
	} {
		if _, err := s.Claim(ctx, bad.kind, bad.name, bad.id); !errors.Is(err, binding.ErrInvalid) {
			t.Errorf("claim %+v: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestDirStore(t *testing.T) {
	dir := t.TempDir()
	s, err := binding.NewDir(binding.DirConfig{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s, "", diskU)
	testGenerationStore(t, s, diskG1, diskG2)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		info, _ := e.Info()
		if strings.HasPrefix(e.Name(), ".") || info.Mode().Perm() != 0o600 {
			t.Fatalf("left %s mode %v", e.Name(), info.Mode())
		}
	}
	// A record file that does not name itself is refused, not trusted.
	os.WriteFile(filepath.Join(dir, "node-forged"), []byte(`{"kind":"node","name":"other","identity":"x"}`), 0o600)
	if _, err := s.Get(context.Background(), binding.Node, "forged"); err == nil || !strings.Contains(err.Error(), "does not name itself") {
		t.Fatalf("forged record: %v", err)
	}
}

// Unit test of the Lease store's logic on a fake clientset; the same
// contract runs against the real API server in k8s_test.go.
func TestLeaseStoreFake(t *testing.T) {
	s, err := binding.NewLeases(binding.LeaseConfig{Client: optimisticClientset(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s, "", diskU)
	testGenerationStore(t, s, diskG1, diskG2)
}

// optimisticClientset is client-go's fake with the API server's
// optimistic concurrency for Leases: the fake's tracker stores no
// resourceVersion and so lets every Update win, and the store contract's
// racing claims of a released name (a Get, then an Update carrying the
// Get's resourceVersion) would then have several winners. Here a create
// sets a resourceVersion and an update whose resourceVersion is not the
// stored one is a Conflict, as on a real API server (the k8s tier runs
// the same contract there). The fake runs its reactors under one lock,
// so the check and the store are one step.
func optimisticClientset() *fake.Clientset {
	c := fake.NewClientset()
	next := 0
	stamp := func(obj runtime.Object) {
		next++
		m, _ := meta.Accessor(obj)
		m.SetResourceVersion(fmt.Sprint(next))
	}
	c.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		stamp(a.(k8stesting.CreateAction).GetObject())
		return false, nil, nil
	})
	c.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.UpdateAction).GetObject()
		m, err := meta.Accessor(obj)
		if err != nil {
			return true, nil, err
		}
		cur, err := c.Tracker().Get(a.GetResource(), a.GetNamespace(), m.GetName())
		if err != nil {
			return true, nil, err
		}
		if cm, _ := meta.Accessor(cur); m.GetResourceVersion() != cm.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), m.GetName(),
				fmt.Errorf("resourceVersion %q is not the stored %q", m.GetResourceVersion(), cm.GetResourceVersion()))
		}
		stamp(obj)
		return false, nil, nil
	})
	return c
}

func TestObjectNameOfLongNodeName(t *testing.T) {
	long := strings.Repeat("a", 250)
	if n := binding.ObjectName(binding.Node, long); len(n) > 253 || !strings.HasPrefix(n, "node-h-") {
		t.Fatalf("object name %q", n)
	}
	if n := binding.ObjectName(binding.Node, "node-1"); n != "node-node-1" {
		t.Fatalf("object name %q", n)
	}
}
