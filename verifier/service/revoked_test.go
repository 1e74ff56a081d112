package service_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/policy/policytest"
	"github.com/latchkey/latchkey/verifier/service"
	"github.com/latchkey/latchkey/verifier/token"
)

// flakyMinter fails Revoke while fail is set.
type flakyMinter struct {
	fakeMinter
	fail bool
}

func (m *flakyMinter) Revoke(ctx context.Context, id string) error {
	if m.fail {
		return errors.New("api server down")
	}
	return m.fakeMinter.Revoke(ctx, id)
}

var _ token.Minter = (*flakyMinter)(nil)

// The sweep finds each denied node's token from the binding records alone
// (node name, machine identity, the machine that holds a denied disk),
// revokes each token once, retries a failed revocation at the next sweep,
// and revokes a token recorded after an earlier sweep (a join that was in
// flight with the old policy).
func TestRevokerSweep(t *testing.T) {
	ctx := context.Background()
	store, err := binding.NewDir(binding.DirConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	idA := "tpm-ek:sha256:" + strings.Repeat("aa", 32)
	idB := "snp-chip:" + strings.Repeat("bb", 64) + "/host-data:" + strings.Repeat("cc", 32)
	idC := "tpm-ak:sha256:" + strings.Repeat("dd", 32)
	idD := "tpm-ek:sha256:" + strings.Repeat("ee", 32)
	set := func(node, id, tok string) {
		t.Helper()
		if _, err := store.Claim(ctx, binding.Node, node, id); err != nil && !errors.Is(err, binding.ErrMismatch) {
			t.Fatal(err)
		}
		if err := store.SetToken(ctx, node, id, tok); err != nil {
			t.Fatal(err)
		}
	}
	set("by-name", idD, "tok001")
	set("by-ek", idA, "tok002")
	set("by-chip", idB, "tok003")
	set("by-ak", idC, "tok004")
	set("keeper", "tpm-ek:sha256:"+strings.Repeat("ff", 32), "tok005")
	set("disk-owner", "tpm-ek:sha256:"+strings.Repeat("12", 32), "tok006")
	if _, err := store.Claim(ctx, binding.Disk, "5e2a7c3d-1b4f-4a6e-8c9d-0f1e2d3c4b5a", "tpm-ek:sha256:"+strings.Repeat("12", 32)); err != nil {
		t.Fatal(err)
	}
	snap, err := policy.Load([]byte(`apiVersion: latchkey/v1
tpm: {}
deny:
  nodeNames: [by-name]
  diskUUIDs: [5e2a7c3d-1b4f-4a6e-8c9d-0f1e2d3c4b5a]
  ekPublicKeyHashes: ["sha256:`+strings.Repeat("aa", 32)+`"]
  akPublicKeyHashes: ["sha256:`+strings.Repeat("dd", 32)+`"]
  snpChipIDs: ["`+strings.Repeat("bb", 64)+`"]
`), policy.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	m := &flakyMinter{fakeMinter: fakeMinter{live: map[string]bool{}}, fail: true}
	r, err := service.NewRevoker(service.RevokerConfig{Policy: policytest.Static(snap), Bindings: store, Minter: m,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep with the API server down: %d, %v", n, err)
	}
	m.fail = false
	if n, err := r.Sweep(ctx); err != nil || n != 5 {
		t.Fatalf("sweep: %d revoked, %v; want 5", n, err)
	}
	got := slices.Sorted(slices.Values(m.revoked))
	if want := []string{"tok001", "tok002", "tok003", "tok004", "tok006"}; !slices.Equal(got, want) {
		t.Fatalf("revoked %v, want %v (keeper's token stays)", got, want)
	}
	if n, _ := r.Sweep(ctx); n != 0 || len(m.revoked) != 5 {
		t.Fatalf("a second sweep revoked again: %d, %v", n, m.revoked)
	}
	// A join in flight with the old policy recorded a new token.
	set("by-ek", idA, "tok007")
	if n, _ := r.Sweep(ctx); n != 1 || m.revoked[len(m.revoked)-1] != "tok007" {
		t.Fatalf("the late token: %d, %v", n, m.revoked)
	}
}
