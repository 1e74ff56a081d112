package binding_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/latchkey/latchkey/verifier/binding"
)

// BenchmarkDirClaim is the directory store's share of a disk-only first
// join: one new disk claim (record written and fsynced, linked, directory
// fsynced). Disk-only mode binds no node name and mints no token.
func BenchmarkDirClaim(b *testing.B) {
	s := benchDir(b)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Claim(ctx, binding.Disk, fmt.Sprintf("%08x-0000-4000-8000-000000000000", i), idA); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDirClaimParallel is BenchmarkDirClaim from 32 joins at once:
// records of different machines share no lock, so their fsyncs overlap.
func BenchmarkDirClaimParallel(b *testing.B) {
	s := benchDir(b)
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			if _, err := s.Claim(ctx, binding.Disk, fmt.Sprintf("%08x-0000-4000-8000-000000000000", i), idA); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkDirRejoin is a rejoin's check: read the disk record.
func BenchmarkDirRejoin(b *testing.B) {
	s := benchDir(b)
	ctx := context.Background()
	if _, err := s.Claim(ctx, binding.Disk, diskU, idA); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		r, err := s.Get(ctx, binding.Disk, diskU)
		if err != nil || binding.Check(r, idA) != nil {
			b.Fatal(err)
		}
	}
}

func benchDir(b *testing.B) *binding.Dir {
	s, err := binding.NewDir(binding.DirConfig{Dir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
