package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	"github.com/latchkey/latchkey/verifier/adminapi"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/policy/policytest"
)

// A denied name is not released: the entry denies the machine bound to
// it, and a release would let that machine back in under a fresh name.
// The same machine's other, undenied name is released as usual.
func TestReleaseOfDeniedNameRefused(t *testing.T) {
	ctx := context.Background()
	store, err := binding.NewDir(binding.DirConfig{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	id := "tpm-ek:sha256:" + strings.Repeat("aa", 32)
	const disk = "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e"
	for _, c := range []struct {
		kind binding.Kind
		name string
	}{{binding.Node, "denied"}, {binding.Node, "alias"}, {binding.Disk, disk}} {
		if _, err := store.Claim(ctx, c.kind, c.name, id); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := policy.Load([]byte("apiVersion: latchkey/v1\ntpm: {}\ndeny:\n  nodeNames: [denied]\n  diskUUIDs: ["+disk+"]\n"), policy.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	b := bindingAdmin{store: store, policy: policytest.Static(snap)}
	for _, c := range []struct {
		kind adminv1.BindingKind
		name string
		want string
	}{
		{adminv1.BindingKind_BINDING_KIND_NODE, "denied", "binding denied: node denied is on the policy's deny list, which denies the machine bound to it; remove the entry first"},
		{adminv1.BindingKind_BINDING_KIND_DISK, disk, "binding denied: disk " + disk + " is on the policy's deny list, which denies the machine bound to it; remove the entry first"},
	} {
		_, err := b.Release(ctx, c.kind, c.name, "test")
		if !errors.Is(err, adminapi.ErrBindingDenied) || err.Error() != c.want {
			t.Fatalf("release %s: %v\nwant %q", c.name, err, c.want)
		}
	}
	if r, err := store.Get(ctx, binding.Node, "denied"); err != nil || r.Identity != id {
		t.Fatalf("the denied name was released: %+v %v", r, err)
	}
	if _, err := b.Release(ctx, adminv1.BindingKind_BINDING_KIND_NODE, "alias", "test"); err != nil {
		t.Fatalf("release of an undenied name: %v", err)
	}
}

// `bindings list` and `tokens list` leave an unreadable record out and
// name it; `tokens revoke` still finds a token the readable records name.
func TestAdminListingsReportSkippedRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := binding.NewDir(binding.DirConfig{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	id := "tpm-ek:sha256:" + strings.Repeat("aa", 32)
	if _, err := store.Claim(ctx, binding.Node, "node-a", id); err != nil {
		t.Fatal(err)
	}
	if err := store.SetToken(ctx, "node-a", id, "abc123"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node-broken"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantSkipped := func(what string, got []*adminv1.SkippedRecord) {
		t.Helper()
		want := "binding: record " + filepath.Join(dir, "node-broken") + ": unexpected end of JSON input"
		if len(got) != 1 || got[0].GetKey() != "node-broken" || got[0].GetReason() != want {
			t.Fatalf("%s: skipped %v, want node-broken: %q", what, got, want)
		}
	}
	bs, skipped, err := bindingAdmin{store: store}.List(ctx)
	if err != nil || len(bs) != 1 || bs[0].GetName() != "node-a" {
		t.Fatalf("bindings list: %v %v", bs, err)
	}
	wantSkipped("bindings list", skipped)

	c := fake.NewClientset(tokenSecret("abc123"))
	m := &recordingMinter{}
	ta := tokenAdmin{client: c, minter: m, bindings: store}
	ts, skipped, err := ta.List(ctx)
	if err != nil || len(ts) != 1 || ts[0].GetId() != "abc123" {
		t.Fatalf("tokens list: %v %v", ts, err)
	}
	wantSkipped("tokens list", skipped)
	// The fake client does not honour dry runs: the list's existence
	// check deleted the Secret, so revoke against a fresh one.
	ta.client = fake.NewClientset(tokenSecret("abc123"))
	if err := ta.Revoke(ctx, "abc123"); err != nil {
		t.Fatalf("tokens revoke with a bad record on file: %v", err)
	}
	// A token no readable record names is not revoked, and the refusal
	// says records were skipped (the token may be on one of them).
	err = ta.Revoke(ctx, "zzz999")
	want := "token not found: not the token of any node this cluster's verifiers bound (latchkey deletes only its own); " +
		"1 unreadable binding record(s) were skipped (`bindings list` names them)"
	if !errors.Is(err, adminapi.ErrTokenNotFound) || err.Error() != want {
		t.Fatalf("revoke of an unknown token: %v\nwant %q", err, want)
	}
}
