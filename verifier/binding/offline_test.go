package binding_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/verifier/binding"
)

// An offline boot is recorded on the bound node's Lease, read back by
// NodeStatuses, and leaves renewTime alone (it is no attestation); only
// the bound machine can record it.
func TestRecordOfflineBoot(t *testing.T) {
	ctx := context.Background()
	s, err := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Node, "node-1", "id:a"); err != nil {
		t.Fatal(err)
	}
	before, _ := s.NodeStatuses(ctx)
	at := time.Date(2026, 12, 1, 10, 0, 0, 456, time.UTC)
	if err := s.RecordOfflineBoot(ctx, "node-1", "id:a", at); err != nil {
		t.Fatal(err)
	}
	sts, err := s.NodeStatuses(ctx)
	if err != nil || len(sts) != 1 {
		t.Fatalf("statuses %+v %v", sts, err)
	}
	if !sts[0].BootedOffline.Equal(at) || !sts[0].Renewed.Equal(before[0].Renewed) {
		t.Fatalf("status %+v, want booted offline at %s and renewTime unchanged (%s)", sts[0], at, before[0].Renewed)
	}
	var mm *binding.MismatchError
	if err := s.RecordOfflineBoot(ctx, "node-1", "id:b", at); !errors.As(err, &mm) || mm.Bound != "id:a" {
		t.Fatalf("other identity: %v", err)
	}
	if err := s.RecordOfflineBoot(ctx, "node-2", "id:a", at); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("unclaimed node: %v", err)
	}
	if err := s.RecordOfflineBoot(ctx, "node-1", "id:a", time.Time{}); !errors.Is(err, binding.ErrInvalid) {
		t.Fatalf("no time: %v", err)
	}
}
