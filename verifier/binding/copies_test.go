package binding_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/latchkey/latchkey/verifier/binding"
)

// leaseVerbs is what c was asked of Leases since mark (its action count
// then).
func leaseVerbs(c interface{ Actions() []k8stesting.Action }, mark int) []string {
	var out []string
	for _, a := range c.Actions()[mark:] {
		if a.GetResource().Resource == "leases" {
			out = append(out, a.GetVerb())
		}
	}
	return out
}

func newReplica(t *testing.T, c *fake.Clientset) *binding.Leases {
	t.Helper()
	s, err := binding.NewLeases(binding.LeaseConfig{Client: c, Logger: slog.New(slog.DiscardHandler), TokenTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A join's writes to the record its replica just claimed read nothing:
// claim, token, re-attestation, the reaper's clearing, one write each.
// The token written is read back as it was written.
func TestUpdatesOfOwnWritesSkipTheRead(t *testing.T) {
	ctx := context.Background()
	c := optimisticClientset()
	s := newReplica(t, c)
	if _, err := s.Claim(ctx, binding.Node, "node-1", idA); err != nil {
		t.Fatal(err)
	}
	mark := len(c.Actions())
	if err := s.SetToken(ctx, "node-1", idA, "abcdef"); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordAttestation(ctx, "node-1", idA, binding.Attestation{Time: time.Now(), EvidenceDigest: "sha256:" + strings.Repeat("ab", 32), Decision: binding.DecisionAttested, Reason: "NONE"}); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearToken(ctx, "node-1", "abcdef"); err != nil {
		t.Fatal(err)
	}
	if got := leaseVerbs(c, mark); !slices.Equal(got, []string{"update", "update", "update"}) {
		t.Fatalf("Lease requests %v, want three updates and no get", got)
	}
	r, err := s.Get(ctx, binding.Node, "node-1")
	if err != nil || r.TokenID != "" || r.Identity != idA {
		t.Fatalf("record after clearing: %+v, %v", r, err)
	}

	// The control: a replica that wrote nothing reads before it writes.
	other := newReplica(t, c)
	mark = len(c.Actions())
	if err := other.SetToken(ctx, "node-1", idA, "ghijkl"); err != nil {
		t.Fatal(err)
	}
	if got := leaseVerbs(c, mark); !slices.Equal(got, []string{"get", "update"}) {
		t.Fatalf("Lease requests of a replica with no copy %v, want get, update", got)
	}
}

// claimedOnA is two replicas on one API server, A having claimed node-1
// for idA (so A holds a copy of that record).
func claimedOnA(t *testing.T) (c *fake.Clientset, a, b *binding.Leases) {
	t.Helper()
	c = optimisticClientset()
	a, b = newReplica(t, c), newReplica(t, c)
	if _, err := a.Claim(context.Background(), binding.Node, "node-1", idA); err != nil {
		t.Fatal(err)
	}
	return c, a, b
}

// Another replica's writes make a copy stale. The refused write is
// followed by a fresh read, and the update decides on what it reads, both
// ways: a copy can neither let a write land on a record that changed nor
// refuse one that a fresh read allows.
func TestStaleCopiesDecideNothing(t *testing.T) {
	ctx := context.Background()

	t.Run("rebound to another machine meanwhile", func(t *testing.T) {
		c, a, b := claimedOnA(t)
		// A's copy says idA; B releases the name and idB claims it.
		if _, err := b.Release(ctx, binding.Node, "node-1", "operator"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Claim(ctx, binding.Node, "node-1", idB); err != nil {
			t.Fatal(err)
		}
		mark := len(c.Actions())
		err := a.SetToken(ctx, "node-1", idA, "abcdef")
		var mm *binding.MismatchError
		if !errors.As(err, &mm) || mm.Bound != idB {
			t.Fatalf("token for idA on a name now bound to idB: %v", err)
		}
		if got := leaseVerbs(c, mark); !slices.Equal(got, []string{"update", "get"}) {
			t.Fatalf("Lease requests %v, want the stale write, then a read", got)
		}
		r, err := b.Get(ctx, binding.Node, "node-1")
		if err != nil || r.Identity != idB || r.TokenID != "" {
			t.Fatalf("record %+v, %v: the stale write must not land", r, err)
		}
	})

	t.Run("released in the copy, bound again to this machine", func(t *testing.T) {
		c, a, b := claimedOnA(t)
		if _, err := a.Release(ctx, binding.Node, "node-1", "operator"); err != nil {
			t.Fatal(err)
		}
		// A's copy says released; B binds the name to idA again.
		if _, err := b.Claim(ctx, binding.Node, "node-1", idA); err != nil {
			t.Fatal(err)
		}
		mark := len(c.Actions())
		if err := a.SetToken(ctx, "node-1", idA, "abcdef"); err != nil {
			t.Fatalf("a copy saying released refused the token: %v", err)
		}
		if got := leaseVerbs(c, mark); !slices.Equal(got, []string{"get", "update"}) {
			t.Fatalf("Lease requests %v, want a fresh read, then the write", got)
		}
		if r, err := b.Get(ctx, binding.Node, "node-1"); err != nil || r.TokenID != "abcdef" {
			t.Fatalf("record %+v, %v", r, err)
		}
	})

	t.Run("nothing to change in the copy", func(t *testing.T) {
		c := optimisticClientset()
		a, b := newReplica(t, c), newReplica(t, c)
		if _, _, err := a.ClaimGeneration(ctx, diskU, idA, 2); err != nil {
			t.Fatal(err)
		}
		if err := b.SetKeyGeneration(ctx, diskU, idA, 3); err != nil {
			t.Fatal(err)
		}
		// A's copy says generation 2 already: only a read shows 3.
		if err := a.SetKeyGeneration(ctx, diskU, idA, 2); err != nil {
			t.Fatal(err)
		}
		r, err := b.Get(ctx, binding.Disk, diskU)
		if err != nil || r.KeyGeneration == nil || *r.KeyGeneration != 2 {
			t.Fatalf("record %+v, %v: want generation 2 written over 3", r, err)
		}
	})

	t.Run("the reaper's clearing after another token", func(t *testing.T) {
		_, a, b := claimedOnA(t)
		if err := a.SetToken(ctx, "node-1", idA, "abcdef"); err != nil {
			t.Fatal(err)
		}
		// B records a newer token; A's copy still names the old one.
		if err := b.SetToken(ctx, "node-1", idA, "ghijkl"); err != nil {
			t.Fatal(err)
		}
		if err := a.ClearToken(ctx, "node-1", "abcdef"); err != nil {
			t.Fatal(err)
		}
		if r, err := b.Get(ctx, binding.Node, "node-1"); err != nil || r.TokenID != "ghijkl" {
			t.Fatalf("record %+v, %v: clearing the old token removed the new one", r, err)
		}
	})
}
