package binding_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/latchkey/latchkey/verifier/binding"
)

// BenchmarkDirFirstJoin is the directory store's share of one first join
// in disk-only-style assembly with a token step: claim the disk, claim
// the node, record the token (each write fsynced, as in service).
func BenchmarkDirFirstJoin(b *testing.B) {
	s, err := binding.NewDir(binding.DirConfig{Dir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		node := fmt.Sprintf("bench-node-%d", i)
		if _, err := s.Claim(ctx, binding.Disk, fmt.Sprintf("%08x-0000-4000-8000-000000000000", i), idA); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Claim(ctx, binding.Node, node, idA); err != nil {
			b.Fatal(err)
		}
		if err := s.SetToken(ctx, node, idA, "abcdef"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDirRejoin is a rejoin's check: read the disk record.
func BenchmarkDirRejoin(b *testing.B) {
	s, err := binding.NewDir(binding.DirConfig{Dir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
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

// BenchmarkDirFirstJoinParallel is BenchmarkDirFirstJoin from many joins
// at once: records of different machines do not share a lock, so their
// fsyncs overlap.
func BenchmarkDirFirstJoinParallel(b *testing.B) {
	s, err := binding.NewDir(binding.DirConfig{Dir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			node := fmt.Sprintf("bench-node-%d", i)
			if _, err := s.Claim(ctx, binding.Disk, fmt.Sprintf("%08x-0000-4000-8000-000000000000", i), idA); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Claim(ctx, binding.Node, node, idA); err != nil {
				b.Fatal(err)
			}
			if err := s.SetToken(ctx, node, idA, "abcdef"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
