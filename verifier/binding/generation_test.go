package binding_test

import (
	"context"
	"errors"
	"testing"

	"github.com/latchkey/latchkey/verifier/binding"
)

// testGenerationStore runs the generation contract against s (a store
// that is also a GenerationRecorder): recorded for the owner only, kept
// across release and takeover, counted, and blocking retirement.
func testGenerationStore(t *testing.T, s binding.Store, disk, other string) {
	ctx := context.Background()
	rec, ok := s.(binding.GenerationRecorder)
	if !ok {
		t.Fatalf("%T records no generations", s)
	}
	if _, err := s.Claim(ctx, binding.Disk, disk, idA); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Disk, other, idA); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Get(ctx, binding.Disk, disk); r.KeyGeneration != nil {
		t.Fatalf("new record has generation %d", *r.KeyGeneration)
	}
	if err := rec.SetKeyGeneration(ctx, disk, idA, 3); err != nil {
		t.Fatal(err)
	}
	if err := rec.SetKeyGeneration(ctx, disk, idA, 3); err != nil { // unchanged: no write, no error
		t.Fatal(err)
	}
	if err := rec.SetKeyGeneration(ctx, disk, idB, 4); !errors.Is(err, binding.ErrMismatch) {
		t.Fatalf("generation for another identity: %v", err)
	}
	if err := rec.SetKeyGeneration(ctx, "00000000-0000-4000-8000-00000000ffff", idA, 1); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("generation of an unrecorded disk: %v", err)
	}
	// A generation no store reads back is refused on write (every
	// store: an out-of-range number must never make a record unreadable).
	for _, bad := range []uint32{binding.MaxGeneration + 1, 1<<32 - 1} {
		if err := rec.SetKeyGeneration(ctx, disk, idA, bad); !errors.Is(err, binding.ErrInvalid) {
			t.Fatalf("generation %d: %v, want ErrInvalid", bad, err)
		}
		if gc, ok := s.(binding.GenerationClaimer); ok {
			if _, _, err := gc.ClaimGeneration(ctx, "00000000-0000-4000-8000-00000000fffe", idA, bad); !errors.Is(err, binding.ErrInvalid) {
				t.Fatalf("claim with generation %d: %v, want ErrInvalid", bad, err)
			}
		}
	}
	r, err := s.Get(ctx, binding.Disk, disk)
	if err != nil || r.KeyGeneration == nil || *r.KeyGeneration != 3 {
		t.Fatalf("record %+v %v, want generation 3", r, err)
	}
	// A released disk keeps its generation (the disk still exists); a
	// takeover keeps it until the new owner's join records its own.
	if _, err := s.Release(ctx, binding.Disk, disk, "test"); err != nil {
		t.Fatal(err)
	}
	if err := rec.SetKeyGeneration(ctx, disk, idA, 5); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("generation on a released record: %v", err)
	}
	if r, _ := s.Get(ctx, binding.Disk, disk); r.KeyGeneration == nil || *r.KeyGeneration != 3 {
		t.Fatalf("released record lost its generation: %+v", r)
	}
	if r, err := s.Claim(ctx, binding.Disk, disk, idB); err != nil || r.KeyGeneration == nil || *r.KeyGeneration != 3 {
		t.Fatalf("takeover: %+v %v, want generation 3 kept", r, err)
	}
	all, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mine []binding.Record
	for _, r := range all {
		if r.Kind == binding.Disk && (r.Name == disk || r.Name == other) {
			mine = append(mine, r)
		}
	}
	counts := binding.CountByGeneration(mine)
	if len(counts) != 2 || counts["3"] != 1 || counts[binding.GenerationUnknown] != 1 {
		t.Fatalf("counts %v", counts)
	}
	if b := binding.RetireBlockers(mine, 3); len(b) != 2 {
		t.Fatalf("retiring 3 is blocked by %d records, want both (3 and unknown)", len(b))
	}
	if err := rec.SetKeyGeneration(ctx, other, idA, 4); err != nil {
		t.Fatal(err)
	}
	mine[0], mine[1] = get(t, s, disk), get(t, s, other)
	if b := binding.RetireBlockers(mine, 3); len(b) != 1 || b[0].Name != disk {
		t.Fatalf("retiring 3: blockers %+v, want only %s", b, disk)
	}
	if b := binding.RetireBlockers(mine, 2); len(b) != 0 {
		t.Fatalf("retiring 2: blockers %+v, want none", b)
	}

	// A claim that records the generation at once: on a new record, not
	// on one already bound (recorded separately then), and on a takeover.
	gc, ok := s.(binding.GenerationClaimer)
	if !ok {
		t.Fatalf("%T claims no generations", s)
	}
	third := other[:len(other)-2] + "ff"
	if r, made, err := gc.ClaimGeneration(ctx, third, idA, 7); err != nil || !made || r.KeyGeneration == nil || *r.KeyGeneration != 7 {
		t.Fatalf("claim with generation: %+v %v %v", r, made, err)
	}
	if g := get(t, s, third).KeyGeneration; g == nil || *g != 7 {
		t.Fatalf("stored generation %v, want 7", g)
	}
	if r, made, err := gc.ClaimGeneration(ctx, third, idA, 8); err != nil || made || *r.KeyGeneration != 7 {
		t.Fatalf("claim of a record bound to the same identity: %+v %v %v, want it unchanged", r, made, err)
	}
	if _, made, err := gc.ClaimGeneration(ctx, third, idB, 8); !errors.Is(err, binding.ErrMismatch) || made {
		t.Fatalf("claim by another identity: %v %v", made, err)
	}
	if _, err := s.Release(ctx, binding.Disk, third, "test"); err != nil {
		t.Fatal(err)
	}
	if r, made, err := gc.ClaimGeneration(ctx, third, idB, 9); err != nil || !made || *r.KeyGeneration != 9 || get(t, s, third).Identity != idB {
		t.Fatalf("takeover with generation: %+v %v %v", r, made, err)
	}
}

func get(t *testing.T, s binding.Store, disk string) binding.Record {
	t.Helper()
	r, err := s.Get(context.Background(), binding.Disk, disk)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
