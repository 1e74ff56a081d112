package binding_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/verifier/binding"
)

func TestRecordAttestationOnNodeLease(t *testing.T) {
	ctx := context.Background()
	s, err := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Node, "node-1", "id:a"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetToken(ctx, "node-1", "id:a", "abcdef"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 10, 0, 0, 123, time.UTC)
	a := binding.Attestation{Time: at, EvidenceDigest: "sha256:" + strings.Repeat("0f", 32), Decision: binding.DecisionRefused, Reason: "PCR_MISMATCH"}
	if err := s.RecordAttestation(ctx, "node-1", "id:a", a); err != nil {
		t.Fatal(err)
	}
	sts, err := s.NodeStatuses(ctx)
	if err != nil || len(sts) != 1 {
		t.Fatalf("statuses %+v %v", sts, err)
	}
	st := sts[0]
	if st.Node != "node-1" || st.Identity != "id:a" || st.Renewed.Sub(at).Abs() >= time.Microsecond || st.Last == nil ||
		!st.Last.Time.Equal(a.Time) || st.Last.EvidenceDigest != a.EvidenceDigest || st.Last.Decision != a.Decision || st.Last.Reason != a.Reason {
		t.Fatalf("status %+v last %+v, want %+v", st, st.Last, a)
	}
	// The token the join recorded is untouched.
	if r, _ := s.Get(ctx, binding.Node, "node-1"); r.TokenID != "abcdef" || r.Identity != "id:a" {
		t.Fatalf("record after RecordAttestation: %+v", r)
	}
	// Another machine cannot record on this node.
	var mm *binding.MismatchError
	if err := s.RecordAttestation(ctx, "node-1", "id:b", a); !errors.As(err, &mm) || mm.Bound != "id:a" {
		t.Fatalf("other identity: %v", err)
	}
	// Nothing is recorded for a node never claimed, nor once released.
	if err := s.RecordAttestation(ctx, "node-2", "id:a", a); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("unclaimed node: %v", err)
	}
	if _, err := s.Release(ctx, binding.Node, "node-1", "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordAttestation(ctx, "node-1", "id:a", a); !errors.Is(err, binding.ErrNotFound) || !strings.Contains(err.Error(), "was released") {
		t.Fatalf("released node: %v", err)
	}
	if sts, _ := s.NodeStatuses(ctx); len(sts) != 0 {
		t.Fatalf("released node still listed: %+v", sts)
	}
}

func TestRecordAttestationValidates(t *testing.T) {
	ctx := context.Background()
	s, _ := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler)})
	s.Claim(ctx, binding.Node, "node-1", "id:a")
	good := binding.Attestation{Time: time.Now(), EvidenceDigest: "sha256:" + strings.Repeat("0f", 32), Decision: binding.DecisionAttested, Reason: "NONE"}
	for name, edit := range map[string]func(*binding.Attestation){
		"no time":      func(a *binding.Attestation) { a.Time = time.Time{} },
		"bad decision": func(a *binding.Attestation) { a.Decision = "maybe" },
		"bad digest":   func(a *binding.Attestation) { a.EvidenceDigest = "md5:00" },
		"bad reason":   func(a *binding.Attestation) { a.Reason = "two words" },
	} {
		a := good
		edit(&a)
		if err := s.RecordAttestation(ctx, "node-1", "id:a", a); !errors.Is(err, binding.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}
