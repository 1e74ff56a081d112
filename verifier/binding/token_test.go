package binding_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/verifier/binding"
)

// SetToken records the token's times; ClearToken removes only the token
// it names, and a release removes the token with the identity.
func TestLeaseTokenTimesAndClear(t *testing.T) {
	ctx := context.Background()
	s, err := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler), TokenTTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Node, "n1", "tpm-ak:1"); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Truncate(time.Second)
	if err := s.SetToken(ctx, "n1", "tpm-ak:1", "abc123"); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, binding.Node, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if r.TokenID != "abc123" || r.TokenRecorded.Before(before) || r.TokenExpiry.Sub(r.TokenRecorded) != 10*time.Minute {
		t.Fatalf("record %+v", r)
	}
	if err := s.ClearToken(ctx, "n1", "zzz999"); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Get(ctx, binding.Node, "n1"); r.TokenID != "abc123" {
		t.Fatalf("clearing another token removed %q's: %+v", "abc123", r)
	}
	if err := s.ClearToken(ctx, "n1", "abc123"); err != nil {
		t.Fatal(err)
	}
	r, _ = s.Get(ctx, binding.Node, "n1")
	if r.TokenID != "" || !r.TokenRecorded.IsZero() || !r.TokenExpiry.IsZero() || r.Identity != "tpm-ak:1" {
		t.Fatalf("after ClearToken: %+v", r)
	}
	if err := s.ClearToken(ctx, "absent", "abc123"); err != nil {
		t.Fatalf("clear on a node with no record: %v", err)
	}
	if _, err := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), TokenTTL: -time.Second}); err == nil {
		t.Fatal("negative TTL accepted")
	}
}

// A token replaced on a node's record is handed to OnTokenReplaced, once;
// recording the same token again, or a first token, replaces nothing.
func TestLeaseTokenReplaced(t *testing.T) {
	ctx := context.Background()
	var replaced []string
	s, err := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler),
		OnTokenReplaced: func(_ context.Context, node, id string) { replaced = append(replaced, node+"/"+id) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Node, "n1", "tpm-ak:1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"aaa111", "aaa111", "bbb222"} {
		if err := s.SetToken(ctx, "n1", "tpm-ak:1", id); err != nil {
			t.Fatal(err)
		}
	}
	if len(replaced) != 1 || replaced[0] != "n1/aaa111" {
		t.Fatalf("replaced %v, want [n1/aaa111]", replaced)
	}
	// Another machine's SetToken fails and replaces nothing.
	if err := s.SetToken(ctx, "n1", "tpm-ak:2", "ccc333"); err == nil || len(replaced) != 1 {
		t.Fatalf("SetToken by another identity: %v, replaced %v", err, replaced)
	}
	if _, err := binding.NewLeases(binding.LeaseConfig{Client: fake.NewClientset(), TokenTTL: -2 * time.Second}); err == nil {
		t.Fatal("negative TTL accepted")
	}
}
