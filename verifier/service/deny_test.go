package service_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/internal/logtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/policy/policytest"
	"github.com/latchkey/latchkey/verifier/service"
)

const diskB = "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2f"

// wantRefused checks err is the refusal reason with exactly detail.
func wantRefused(t *testing.T, what string, err error, reason latchkeyv1.Reason, detail string) {
	t.Helper()
	var r *ticket.RefusedError
	if !errors.As(err, &r) || r.Reason != reason || r.Detail != detail {
		t.Fatalf("%s: err = %v\nwant %v %q", what, err, reason, detail)
	}
}

func revokedDetail(entry string) string {
	return "revoked by the policy's deny list (" + entry + "); an operator readmits the machine by removing the entry"
}

func reattestOf(node, disk string) ticket.Request {
	q := worker(disk)
	q.NodeName, q.Rejoin, q.Reattest = node, true, true
	return q
}

// A re-attestation gets the deny list: a denied node, a denied disk, and
// a node of the machine bound to a denied name are refused as REVOKED,
// and the refusal is recorded on the node's Lease (so the taint
// controller taints it).
func TestReattestHonoursDenyList(t *testing.T) {
	var rs *recordingStore
	pol := &swapPolicy{}
	e := startVerifier(t, envOpt{minter: &fakeMinter{}, policy: pol, store: func(s binding.Store) binding.Store {
		rs = &recordingStore{Store: s}
		return rs
	}})
	c := clientOnce(t, e, &attesttest.Issuer{})
	ctx := context.Background()
	first := worker(diskA)
	second := worker(diskB)
	second.NodeName = "node-2"
	for _, q := range []ticket.Request{first, second} {
		if _, err := c.Get(ctx, q); err != nil {
			t.Fatalf("join %s: %v", q.NodeName, err)
		}
	}
	cases := []struct {
		name, deny string
		q          ticket.Request
		entry      string
	}{
		{"node name", "  nodeNames: [node-1]\n", reattestOf("node-1", diskA), "deny.nodeNames: node-1"},
		{"disk", "  diskUUIDs: [" + diskA + "]\n", reattestOf("node-1", diskA), "deny.diskUUIDs: " + diskA},
		// Slips past a check of the Hello's own names: the machine's
		// other node and disk, neither of them denied.
		{"the machine bound to a denied name", "  nodeNames: [node-1]\n", reattestOf("node-2", diskB),
			"deny.nodeNames: node-1, the machine bound to it"},
		{"the machine bound to a denied disk", "  diskUUIDs: [" + diskA + "]\n", reattestOf("node-2", diskB),
			"deny.diskUUIDs: " + diskA + ", the machine bound to it"},
	}
	for _, tc := range cases {
		pol.set(t, tc.deny, "")
		before := len(rs.recorded())
		_, err := c.Get(ctx, tc.q)
		wantRefused(t, tc.name, err, latchkeyv1.Reason_REVOKED, revokedDetail(tc.entry))
		recs := rs.recorded()
		if len(recs) != before+1 || recs[before].Decision != binding.DecisionRefused || recs[before].Reason != "REVOKED" {
			t.Fatalf("%s: recorded %+v, want one refused REVOKED result", tc.name, recs[before:])
		}
	}
	pol.set(t, "", "")
	if _, err := c.Get(ctx, reattestOf("node-1", diskA)); err != nil {
		t.Fatalf("re-attestation with the entry removed: %v", err)
	}
}

// A re-attestation writes the disk's generation only when it passed every
// check, and only a generation this verifier serves: a denied machine's,
// or one naming a number it never served (above the range every store
// reads back included), changes nothing on record.
func TestReattestGenerationChecked(t *testing.T) {
	var store binding.Store
	pol := &swapPolicy{}
	e := startVerifier(t, envOpt{keys: generations(t), bindings: &store, policy: pol})
	c := clientOnce(t, e, &attesttest.Issuer{})
	ctx := context.Background()
	if _, err := c.Get(ctx, worker(diskA)); err != nil {
		t.Fatal(err)
	}
	recorded := func() uint32 {
		t.Helper()
		r, err := store.Get(ctx, binding.Disk, diskA)
		if err != nil || r.KeyGeneration == nil {
			t.Fatalf("disk record: %+v %v", r, err)
		}
		return *r.KeyGeneration
	}
	unknown := func(n string) string {
		return "disk " + diskA + " names master-secret generation " + n + ", which is unknown to this verifier (it serves 0, 2)"
	}
	for _, tc := range []struct {
		gen    uint32
		detail string
	}{
		{4294967295, unknown("4294967295")},
		{2147483648, unknown("2147483648")},
		{7, unknown("7")},
		{1, "disk " + diskA + " is keyed under master-secret generation 1, which this verifier no longer serves (it serves 0, 2); add generation 1 back to masterSecrets to open it"},
	} {
		q := reattestOf("node-1", diskA)
		q.DiskKeyGeneration = gen(tc.gen)
		_, err := c.Get(ctx, q)
		wantRefused(t, "generation "+tc.detail, err, latchkeyv1.Reason_KEY_GENERATION_RETIRED, tc.detail)
		if g := recorded(); g != 2 {
			t.Fatalf("generation %d: record now names %d, want 2", tc.gen, g)
		}
	}
	// A served generation from a denied machine is not written either.
	pol.set(t, "  diskUUIDs: ["+diskA+"]\n", "")
	q := reattestOf("node-1", diskA)
	q.DiskKeyGeneration = gen(0)
	_, err := c.Get(ctx, q)
	wantRefused(t, "denied", err, latchkeyv1.Reason_REVOKED, revokedDetail("deny.diskUUIDs: "+diskA))
	if g := recorded(); g != 2 {
		t.Fatalf("a denied re-attestation wrote generation %d", g)
	}
	pol.set(t, "", "")
	if _, err := c.Get(ctx, q); err != nil {
		t.Fatal(err)
	}
	if g := recorded(); g != 0 {
		t.Fatalf("an admitted re-attestation recorded %d, want 0", g)
	}
}

// A first join refused for its generation claims nothing: neither the
// disk nor the node is on record afterwards. The detail says what is
// true: a generation above the current one was never served by this
// verifier; one below it was retired.
func TestRefusedFirstJoinLeavesNoClaim(t *testing.T) {
	var store binding.Store
	e := startVerifier(t, envOpt{keys: generations(t), bindings: &store, minter: &fakeMinter{}})
	c := clientOnce(t, e, &attesttest.Issuer{})
	ctx := context.Background()
	for _, tc := range []struct {
		gen    uint32
		detail string
	}{
		{7, "disk " + diskA + " names master-secret generation 7, which is unknown to this verifier (it serves 0, 2)"},
		{4294967295, "disk " + diskA + " names master-secret generation 4294967295, which is unknown to this verifier (it serves 0, 2)"},
		{1, "disk " + diskA + " is keyed under master-secret generation 1, which this verifier no longer serves (it serves 0, 2); add generation 1 back to masterSecrets to open it"},
	} {
		q := worker(diskA)
		q.RequestToken, q.DiskKeyGeneration = true, gen(tc.gen)
		_, err := c.Get(ctx, q)
		wantRefused(t, "first join", err, latchkeyv1.Reason_KEY_GENERATION_RETIRED, tc.detail)
		recs, err := store.List(ctx)
		if err != nil || len(recs) != 0 {
			t.Fatalf("generation %d: records after the refused join: %+v %v", tc.gen, recs, err)
		}
	}
	if e.minter.minted != 0 {
		t.Fatalf("minted %d tokens for refused joins", e.minter.minted)
	}
}

// A node-name or disk entry denies the machine bound to it: under a fresh
// node name and a fresh disk (everything the machine controls) it is
// refused as REVOKED, and claims nothing. Another machine with those fresh
// names is admitted.
func TestDenyNodeNameDeniesItsMachine(t *testing.T) {
	var store binding.Store
	pol := &swapPolicy{}
	e := startVerifier(t, envOpt{minter: &fakeMinter{}, policy: pol, bindings: &store})
	c := clientOnce(t, e, &attesttest.Issuer{})
	ctx := context.Background()
	if _, err := c.Get(ctx, worker(diskA)); err != nil {
		t.Fatal(err)
	}
	fresh := worker(diskB)
	fresh.NodeName = "node-9"
	for _, tc := range []struct{ deny, entry string }{
		{"  nodeNames: [node-1]\n", "deny.nodeNames: node-1, the machine bound to it"},
		{"  diskUUIDs: [" + diskA + "]\n", "deny.diskUUIDs: " + diskA + ", the machine bound to it"},
	} {
		pol.set(t, tc.deny, "")
		_, err := c.Get(ctx, fresh)
		wantRefused(t, "fresh names", err, latchkeyv1.Reason_REVOKED, revokedDetail(tc.entry))
		for _, k := range []struct {
			kind binding.Kind
			name string
		}{{binding.Node, "node-9"}, {binding.Disk, diskB}} {
			if _, err := store.Get(ctx, k.kind, k.name); !errors.Is(err, binding.ErrNotFound) {
				t.Fatalf("the denied machine claimed %s %s: %v", k.kind, k.name, err)
			}
		}
		if !strings.Contains(e.logs.String(), "deny=\""+tc.entry+"\"") {
			t.Fatalf("audit line does not name %q:\n%s", tc.entry, e.logs)
		}
	}
	pol.set(t, "  nodeNames: [node-1]\n", "fake:other-machine")
	if _, err := c.Get(ctx, fresh); err != nil {
		t.Fatalf("another machine under the fresh names: %v", err)
	}
}

// In disk-only mode no node name is ever bound: a nodeNames entry denies
// the name only (docs/configuration.md), and the identity forms or the
// disk's UUID deny the machine.
func TestDenyNodeNameInDiskOnlyModeIsNameOnly(t *testing.T) {
	pol := &swapPolicy{}
	e := startVerifier(t, envOpt{policy: pol})
	c := clientOnce(t, e, &attesttest.Issuer{})
	ctx := context.Background()
	if _, err := c.Get(ctx, worker(diskA)); err != nil {
		t.Fatal(err)
	}
	pol.set(t, "  nodeNames: [node-1]\n", "")
	_, err := c.Get(ctx, worker(diskA))
	wantRefused(t, "denied name", err, latchkeyv1.Reason_REVOKED, revokedDetail("deny.nodeNames: node-1"))
	other := worker(diskA)
	other.NodeName, other.Rejoin = "node-9", true
	if _, err := c.Get(ctx, other); err != nil {
		t.Fatalf("disk-only mode: the machine under another name: %v", err)
	}
	pol.set(t, "  diskUUIDs: ["+diskA+"]\n", "")
	fresh := worker(diskB)
	fresh.NodeName = "node-9"
	_, err = c.Get(ctx, fresh)
	wantRefused(t, "fresh disk", err, latchkeyv1.Reason_REVOKED, revokedDetail("deny.diskUUIDs: "+diskA+", the machine bound to it"))
}

// The sweep revokes the tokens of the machine bound to a denied name
// under its other names too, and an unreadable record is skipped and
// logged, not fatal to the sweep.
func TestRevokerSweepDeniesBoundMachineAndSkipsBadRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := binding.NewDir(binding.DirConfig{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idX := "tpm-ek:sha256:" + strings.Repeat("aa", 32)
	idY := "tpm-ek:sha256:" + strings.Repeat("bb", 32)
	for _, n := range []struct{ node, id, tok string }{{"denied", idX, "tok001"}, {"alias", idX, "tok002"}, {"keeper", idY, "tok003"}} {
		if _, err := store.Claim(ctx, binding.Node, n.node, n.id); err != nil {
			t.Fatal(err)
		}
		if err := store.SetToken(ctx, n.node, n.id, n.tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "node-broken"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := policy.Load([]byte("apiVersion: latchkey/v1\ntpm: {}\ndeny:\n  nodeNames: [denied]\n"), policy.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	m := &fakeMinter{live: map[string]bool{}}
	logs := &logtest.Buffer{}
	r, err := service.NewRevoker(service.RevokerConfig{Policy: policytest.Static(snap), Bindings: store, Minter: m,
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs), nil))})
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.Sweep(ctx)
	if err != nil || n != 2 {
		t.Fatalf("sweep: %d revoked, %v; want 2", n, err)
	}
	if got := slices.Sorted(slices.Values(m.revoked)); !slices.Equal(got, []string{"tok001", "tok002"}) {
		t.Fatalf("revoked %v, want the denied machine's two tokens", got)
	}
	if !strings.Contains(logs.String(), `msg="revocation sweep: binding record unreadable, skipped" record=node-broken`) {
		t.Fatalf("skipped record not logged:\n%s", logs)
	}
	// A record that stays bad is logged once, not at every sweep.
	if _, err := r.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "record=node-broken"); n != 1 {
		t.Fatalf("the bad record was logged %d times over two sweeps, want once", n)
	}
	if !strings.Contains(logs.String(), `node=alias identity=`+idX+` token_id=tok002 deny="deny.nodeNames: denied, the machine bound to it"`) {
		t.Fatalf("alias revocation does not name the entry:\n%s", logs)
	}
}
