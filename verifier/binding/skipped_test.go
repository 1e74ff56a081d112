package binding_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/verifier/binding"
)

// A generation over 2^31-1 is refused on write by every store, whatever
// the path (claim with a generation, set on a bound record), and the
// boundary itself is accepted.
func TestGenerationRangeRefusedOnWrite(t *testing.T) {
	ctx := context.Background()
	dir, err := binding.NewDir(binding.DirConfig{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]interface {
		binding.Store
		binding.GenerationRecorder
		binding.GenerationClaimer
	}{"dir": dir, "leases": leases} {
		for _, bad := range []uint32{binding.MaxGeneration + 1, 4294967295} {
			want := "invalid binding: key generation " + strconv.FormatUint(uint64(bad), 10) + " is over 2147483647"
			if _, _, err := s.ClaimGeneration(ctx, diskG1, idA, bad); !errors.Is(err, binding.ErrInvalid) || err.Error() != want {
				t.Fatalf("%s: ClaimGeneration(%d) = %v, want %q", name, bad, err, want)
			}
			if _, err := s.Get(ctx, binding.Disk, diskG1); !errors.Is(err, binding.ErrNotFound) {
				t.Fatalf("%s: a refused claim left a record: %v", name, err)
			}
		}
		// Slips past a check that only looks at claims: a bound record
		// set to an out-of-range number afterwards.
		if _, _, err := s.ClaimGeneration(ctx, diskG2, idA, binding.MaxGeneration); err != nil {
			t.Fatalf("%s: the largest generation refused: %v", name, err)
		}
		if err := s.SetKeyGeneration(ctx, diskG2, idA, binding.MaxGeneration+1); !errors.Is(err, binding.ErrInvalid) {
			t.Fatalf("%s: SetKeyGeneration(2^31) = %v, want ErrInvalid", name, err)
		}
		r, err := s.Get(ctx, binding.Disk, diskG2)
		if err != nil || r.KeyGeneration == nil || *r.KeyGeneration != binding.MaxGeneration {
			t.Fatalf("%s: record after the refused write: %+v %v", name, r, err)
		}
	}
}

// A directory record that does not read back (a generation out of range,
// a file cut short) is skipped by List and reported with its file name
// and reason; every other record is listed.
func TestDirListSkipsBadRecord(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	s, err := binding.NewDir(binding.DirConfig{Dir: d, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Node, "good", idA); err != nil {
		t.Fatal(err)
	}
	// Written by hand, as an edited file or an older verifier would:
	// well-formed JSON naming itself, with a generation no store writes.
	bigGen := `{"kind":"disk","name":"` + diskG1 + `","identity":"` + idA + `","created":"2026-01-01T00:00:00Z","keyGeneration":4294967295}`
	if err := os.WriteFile(filepath.Join(d, "disk-"+diskG1), []byte(bigGen), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "disk-"+diskG2), []byte(`{"kind":"disk"`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The read path refuses the out-of-range record too.
	if _, err := s.Get(ctx, binding.Disk, diskG1); err == nil || !strings.Contains(err.Error(), "does not name itself") {
		t.Fatalf("Get of the out-of-range record: %v", err)
	}
	recs, err := s.List(ctx)
	skipped, rest := binding.Skipped(err)
	if rest != nil {
		t.Fatalf("List failed whole: %v", rest)
	}
	if len(recs) != 1 || recs[0].Name != "good" {
		t.Fatalf("listed %+v, want the good record alone", recs)
	}
	want := []binding.SkippedRecord{
		{Key: "disk-" + diskG1, Reason: "binding: record " + filepath.Join(d, "disk-"+diskG1) + " does not name itself"},
		{Key: "disk-" + diskG2, Reason: "binding: record " + filepath.Join(d, "disk-"+diskG2) + ": unexpected end of JSON input"},
	}
	if len(skipped) != len(want) || skipped[0] != want[0] || skipped[1] != want[1] {
		t.Fatalf("skipped %+v\nwant    %+v", skipped, want)
	}
	var se *binding.SkippedError
	if !errors.As(err, &se) || !strings.HasPrefix(err.Error(), "binding: 2 unreadable record(s) skipped: disk-"+diskG1+": ") {
		t.Fatalf("error %v", err)
	}
}

// A Lease another writer edited to a generation over 2^31-1 is skipped by
// List and reported by name; the listing of every other record stands.
func TestLeaseListSkipsBadRecord(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	s, err := binding.NewLeases(binding.LeaseConfig{Client: client, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Node, "good", idA); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ClaimGeneration(ctx, diskG1, idA, 3); err != nil {
		t.Fatal(err)
	}
	leases := client.CoordinationV1().Leases(binding.DefaultNamespace)
	l, err := leases.Get(ctx, "disk-"+diskG1, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Annotations[kubekey.AnnotationKeyGeneration] = "4294967295"
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A Lease with latchkey's labels that names nothing.
	junk := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-junk", Namespace: binding.DefaultNamespace,
		Labels: map[string]string{kubekey.LabelManagedBy: kubekey.ManagedBy, kubekey.LabelBinding: "node"}}}
	if _, err := leases.Create(ctx, junk, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	recs, err := s.List(ctx)
	skipped, rest := binding.Skipped(err)
	if rest != nil {
		t.Fatalf("List failed whole: %v", rest)
	}
	if len(recs) != 1 || recs[0].Name != "good" {
		t.Fatalf("listed %+v, want the good record alone", recs)
	}
	want := map[string]string{
		"disk-" + diskG1: `binding: lease latchkey-system/disk-` + diskG1 + `: latchkey.io/key-generation "4294967295": not a generation number`,
		"node-junk":      "binding: lease latchkey-system/node-junk is not a latchkey binding record",
	}
	if len(skipped) != len(want) {
		t.Fatalf("skipped %+v, want %v", skipped, want)
	}
	for _, sk := range skipped {
		if want[sk.Key] != sk.Reason {
			t.Fatalf("skipped %s: %q, want %q", sk.Key, sk.Reason, want[sk.Key])
		}
	}
}

// Skipped separates a listing that left records out from one that failed.
func TestSkippedSeparatesFailures(t *testing.T) {
	if s, err := binding.Skipped(nil); s != nil || err != nil {
		t.Fatalf("Skipped(nil) = %v, %v", s, err)
	}
	down := errors.New("api server down")
	if s, err := binding.Skipped(down); s != nil || err != down {
		t.Fatalf("Skipped(failure) = %v, %v", s, err)
	}
	wrapped := errors.Join(&binding.SkippedError{Records: []binding.SkippedRecord{{Key: "k", Reason: "r"}}})
	if s, err := binding.Skipped(wrapped); err != nil || len(s) != 1 || s[0].Key != "k" {
		t.Fatalf("Skipped(wrapped) = %v, %v", s, err)
	}
}
