package app_test

// Identity binding against the assembled verifier: two real swtpm TPMs
// with different EKs certified by one EK CA (and two SNP test-signer VMs
// on different chips) attest successfully, and only the binding records
// keep one from taking the other's disk or node name.

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logtest"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/keys"
)

const diskB = "5e2a7c3d-1b4f-4a6e-8c9d-0f1e2d3c4b5a"

// idRig is an assembled verifier with its admin socket and config kept,
// so a test can restart it with another identity option.
type idRig struct {
	*rig
	cfg    *app.Config
	master []byte
}

// newIDRig starts the assembled verifier on policy pol with the Lease
// binding store on the rig's (fake) clientset, or the directory store
// the config opens when leases is false.
func newIDRig(t *testing.T, pol map[string]any, leases, adopt bool) *idRig {
	t.Helper()
	master := randomSecret()
	dir, cfg := verifierFiles(t, pol, master, "test-cluster")
	cfg.AdminSocket, cfg.Identity = filepath.Join(dir, "admin.sock"), app.Identity{AdoptUnbound: adopt}
	r := &rig{client: signingClientset(t), logs: &logtest.Buffer{}}
	if leases {
		var err error
		r.bindings, err = binding.NewLeases(binding.LeaseConfig{Client: r.client, Logger: slog.New(slog.NewTextHandler(r.logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
	}
	ir := &idRig{rig: r, cfg: cfg, master: master}
	ir.start(t)
	return ir
}

// start (re)starts the verifier on a copy of r.cfg, stopping the one
// running.
func (r *idRig) start(t *testing.T) {
	t.Helper()
	if r.stop != nil {
		r.stop()
	}
	cfg := *r.cfg
	startAssembled(t, r.rig, &cfg, fakeSignedMinter(t, r.rig))
}

// tpmPolicy trusts sim's EK CA and its current PCR values.
func tpmPolicy(t *testing.T, sim *tpmtest.Simulator) map[string]any {
	t.Helper()
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"tpm": tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}}
}

func tpmIssuer(t *testing.T, sim *tpmtest.Simulator) attest.Issuer {
	t.Helper()
	iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device, PCRs: testPCRs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { iss.Close() })
	return iss
}

func req(node, disk string, rejoin, token bool) ticket.Request {
	return ticket.Request{NodeName: node, DiskUUID: disk, Role: latchkeyv1.Role_ROLE_WORKER, Rejoin: rejoin, RequestToken: token}
}

// join runs one join that must succeed.
func (r *idRig) join(t *testing.T, iss attest.Issuer, q ticket.Request) *latchkeyv1.Ticket {
	t.Helper()
	tk, err := r.agentOnce(t, iss).Get(context.Background(), q)
	if err != nil {
		t.Fatalf("join %+v: %v\nlog:\n%s", q, err, r.logs)
	}
	return tk
}

// refusedIdentity runs one join that must be refused with
// IDENTITY_MISMATCH and a detail containing detail, with no token Secret
// beyond the tokens that exist.
func (r *idRig) refusedIdentity(t *testing.T, iss attest.Issuer, q ticket.Request, detail string, tokens int) {
	t.Helper()
	_, err := r.agentOnce(t, iss).Get(context.Background(), q)
	var re *ticket.RefusedError
	if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_IDENTITY_MISMATCH || !strings.Contains(err.Error(), detail) {
		t.Fatalf("join %+v: err = %v, want IDENTITY_MISMATCH containing %q", q, err, detail)
	}
	if n := len(r.tokenSecrets(t)); n != tokens {
		t.Fatalf("%d token secrets after a refused join, want %d", n, tokens)
	}
}

// lastDecision is the last audit line of a join.
func (r *idRig) lastDecision(t *testing.T) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.logs.String()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], `msg="join decision"`) {
			return lines[i]
		}
	}
	t.Fatal("no join decision logged")
	return ""
}

// admin is the verifier's admin API, as `latchkey-verifier bindings`
// calls it (peer credentials: the test runs as root).
func (r *idRig) admin(t *testing.T) adminv1.VerifierAdminClient {
	t.Helper()
	// 0660: the verifier's user and group, and root; never every user.
	fi, err := os.Stat(r.cfg.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Fatalf("admin socket mode %v, want 0660", fi.Mode().Perm())
	}
	conn, err := localapi.Dial(r.cfg.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return adminv1.NewVerifierAdminClient(conn)
}

func (r *idRig) release(t *testing.T, kind adminv1.BindingKind, name string) *adminv1.Binding {
	t.Helper()
	resp, err := r.admin(t).ReleaseBinding(context.Background(), &adminv1.ReleaseBindingRequest{Kind: kind, Name: name})
	if err != nil {
		t.Fatalf("release %v %s: %v", kind, name, err)
	}
	return resp.GetReleased()
}

func machineID(t *testing.T, r *idRig, node string) string {
	t.Helper()
	b, err := r.bindingsStore(t).Get(context.Background(), binding.Node, node)
	if err != nil {
		t.Fatal(err)
	}
	return b.Identity
}

func (r *idRig) bindingsStore(t *testing.T) binding.Store {
	t.Helper()
	if r.bindings != nil {
		return r.bindings
	}
	s, err := binding.NewDir(binding.DirConfig{Dir: filepath.Join(r.cfg.StateDir, "bindings")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestIdentityTwoTPMsSameCA(t *testing.T) {
	sims := tpmtest.StartSiblings(t, 2)
	r := newIDRig(t, tpmPolicy(t, sims[0]), true, false)
	tpm1, tpm2 := tpmIssuer(t, sims[0]), tpmIssuer(t, sims[1])

	first := r.join(t, tpm1, req("node-1", diskA, false, false))
	if first.Token == "" {
		t.Fatal("first join got no token")
	}
	id1 := machineID(t, r, "node-1")
	if !strings.HasPrefix(id1, "tpm-ek:sha256:") || !strings.Contains(r.lastDecision(t), "identity="+id1) {
		t.Fatalf("node-1 bound to %q; audit: %s", id1, r.lastDecision(t))
	}
	lease, err := r.client.CoordinationV1().Leases("latchkey-system").Get(context.Background(), "node-node-1", metav1.GetOptions{})
	if err != nil || lease.Annotations[kubekey.AnnotationTokenID] != first.Token[:6] || *lease.Spec.HolderIdentity != id1 {
		t.Fatalf("node lease %+v: %v", lease, err)
	}

	// TPM 2 attests fine (same CA, same PCRs) but may not have TPM 1's disk.
	r.refusedIdentity(t, tpm2, req("node-2", diskA, false, false), "disk "+diskA+" is bound to another machine", 1)
	audit := r.lastDecision(t)
	if !strings.Contains(audit, "reason=IDENTITY_MISMATCH") || !strings.Contains(audit, "bound_identity="+id1) ||
		!strings.Contains(audit, "identity=tpm-ek:sha256:") || strings.Contains(audit, " identity="+id1) {
		t.Fatalf("audit line lacks both identities: %s", audit)
	}
	// ... nor on a rejoin (it copied the LUKS header) ...
	r.refusedIdentity(t, tpm2, req("node-2", diskA, true, false), "disk "+diskA+" is bound to another machine", 1)
	// ... nor TPM 1's node name, with a disk of its own: no token exists,
	// and the refused join claimed nothing.
	r.refusedIdentity(t, tpm2, req("node-1", diskB, false, false), "node node-1 is bound to another machine", 1)
	if _, err := r.bindingsStore(t).Get(context.Background(), binding.Disk, diskB); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("the refused join left disk %s claimed: %v", diskB, err)
	}
	// TPM 2 joins under its own name with its own disk, then asks, as a
	// rejoin wanting a token, for TPM 1's name.
	if tk := r.join(t, tpm2, req("node-2", diskB, false, false)); tk.Token == "" {
		t.Fatal("TPM 2's own join got no token")
	}
	r.refusedIdentity(t, tpm2, req("node-1", diskB, true, true), "node node-1 is bound to another machine", 2)

	// TPM 1 reboots: the same key, no token.
	again := r.join(t, tpm1, req("node-1", diskA, true, false))
	if !bytes.Equal(again.DiskKey, first.DiskKey) || again.Token != "" {
		t.Fatal("TPM 1's rejoin: want the same key and no token")
	}

	// The machine is replaced: an operator releases its name and disk,
	// and the replacement (TPM 2, with the old disk) takes both.
	if got := r.release(t, adminv1.BindingKind_BINDING_KIND_NODE, "node-1"); got.GetIdentity() != id1 || got.GetTokenId() != first.Token[:6] {
		t.Fatalf("released %+v", got)
	}
	r.release(t, adminv1.BindingKind_BINDING_KIND_DISK, diskA)
	if !strings.Contains(r.logs.String(), `msg="binding released by admin" component=localapi kind=node name=node-1 identity=`+id1) ||
		!strings.Contains(r.logs.String(), "uid=0") {
		t.Fatalf("release not audited with who and what:\n%s", r.logs)
	}
	repl := r.join(t, tpm2, req("node-1", diskA, true, true))
	if !bytes.Equal(repl.DiskKey, first.DiskKey) || repl.Token == "" {
		t.Fatal("replacement: want the disk's key and a token")
	}
	id2 := machineID(t, r, "node-1")
	if id2 == id1 || !strings.HasPrefix(id2, "tpm-ek:sha256:") {
		t.Fatalf("node-1 now bound to %q", id2)
	}
	// The old machine is now the stranger.
	r.refusedIdentity(t, tpm1, req("node-1", diskA, true, false), "is bound to another machine", 3)

	list, err := r.admin(t).ListBindings(context.Background(), &adminv1.ListBindingsRequest{})
	if err != nil || len(list.GetBindings()) != 4 {
		t.Fatalf("bindings %v: %v", list, err)
	}
	for _, b := range list.GetBindings() {
		if b.GetIdentity() != id2 {
			t.Fatalf("binding %+v, want identity %s", b, id2)
		}
	}
	// Releasing what is not bound says so.
	_, err = r.admin(t).ReleaseBinding(context.Background(), &adminv1.ReleaseBindingRequest{Kind: adminv1.BindingKind_BINDING_KIND_DISK, Name: "00000000-0000-4000-8000-000000000009"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("release of an unbound disk: %v, want NotFound", err)
	}
	_, err = r.admin(t).ReleaseBinding(context.Background(), &adminv1.ReleaseBindingRequest{Kind: adminv1.BindingKind_BINDING_KIND_NODE, Name: "Not_A_Node"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("release of a bad name: %v, want InvalidArgument", err)
	}
}

// A disk formatted before identity binding has no record. Its rejoin is
// refused unless the operator turns adoption on; adopted, it gets the key
// today's derivation gives its UUID (so its LUKS header still opens), and
// once adoption is off again it is bound like any other.
func TestIdentityAdoptUnbound(t *testing.T) {
	sims := tpmtest.StartSiblings(t, 2)
	r := newIDRig(t, tpmPolicy(t, sims[0]), false, false)
	tpm1, tpm2 := tpmIssuer(t, sims[0]), tpmIssuer(t, sims[1])
	old := req("node-1", diskA, true, false)

	r.refusedIdentity(t, tpm1, old, "disk "+diskA+" has no binding record (set up before identity binding); the verifier adopts such names only with identity.adoptUnbound", 0)

	r.cfg.Identity.AdoptUnbound = true
	r.start(t)
	tk := r.join(t, tpm1, old)
	d, err := keys.NewDeriver(r.master, []byte("test-cluster"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := d.DiskKey(diskA)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tk.DiskKey, want) {
		t.Fatal("the adopted disk got another key than the one its header was made with")
	}
	if a := r.lastDecision(t); !strings.Contains(a, "adopted=disk,node") {
		t.Fatalf("adoption not audited: %s", a)
	}

	r.cfg.Identity.AdoptUnbound = false
	r.start(t)
	if again := r.join(t, tpm1, old); !bytes.Equal(again.DiskKey, want) {
		t.Fatal("rejoin after the upgrade: another key")
	}
	r.refusedIdentity(t, tpm2, old, "disk "+diskA+" is bound to another machine", 0)
}

func TestIdentityTwoSNPChips(t *testing.T) {
	chip2 := bytes.Repeat([]byte{0x42}, 64)
	vm1 := snptest.New(t)
	vm2 := snptest.NewWithOptions(t, snptest.Options{ChipID: chip2})
	r := newIDRig(t, map[string]any{"snp": vm1.Policy()}, false, false)

	first := r.join(t, vm1.Issuer(), req("node-1", diskA, false, false))
	if id := machineID(t, r, "node-1"); id != "snp-chip:"+hex.EncodeToString(snptest.DefaultChipID) {
		t.Fatalf("node-1 bound to %q", id)
	}
	r.refusedIdentity(t, vm2.Issuer(), req("node-2", diskA, false, false), "disk "+diskA+" is bound to another machine", 1)
	if a := r.lastDecision(t); !strings.Contains(a, "identity=snp-chip:"+hex.EncodeToString(chip2)) || !strings.Contains(a, "bound_identity=snp-chip:"+hex.EncodeToString(snptest.DefaultChipID)) {
		t.Fatalf("audit: %s", a)
	}
	r.refusedIdentity(t, vm2.Issuer(), req("node-1", diskB, false, false), "node node-1 is bound to another machine", 1)

	again := r.join(t, vm1.Issuer(), req("node-1", diskA, true, false))
	if !bytes.Equal(again.DiskKey, first.DiskKey) || again.Token != "" {
		t.Fatal("vm1's rejoin: want the same key and no token")
	}
	// The VM moves to another host (another chip): an operator re-binds.
	r.release(t, adminv1.BindingKind_BINDING_KIND_NODE, "node-1")
	r.release(t, adminv1.BindingKind_BINDING_KIND_DISK, diskA)
	moved := r.join(t, vm2.Issuer(), req("node-1", diskA, true, true))
	if !bytes.Equal(moved.DiskKey, first.DiskKey) || moved.Token == "" {
		t.Fatal("moved VM: want the disk's key and a token")
	}
	r.refusedIdentity(t, vm1.Issuer(), req("node-1", diskA, true, false), "is bound to another machine", 2)
}

// A report whose CHIP_ID is masked names no machine: nothing is bound and
// nothing released.
func TestIdentitySNPMaskedChipRefused(t *testing.T) {
	vm := snptest.New(t)
	r := newIDRig(t, map[string]any{"snp": vm.Policy()}, false, false)
	masked := snptest.NewWithOptions(t, snptest.Options{ChipID: make([]byte, 64)})
	r.refusedIdentity(t, masked.Issuer(), req("node-1", diskA, false, false), "names no stable machine identity", 0)
}

// The identity section is strict like the rest of the config, and its
// zero value refuses unrecorded rejoins.
func TestIdentityConfigStrict(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"policy: p\nclusterSalt: s\nidentity:\n  adoptUnbound: true\n":                           "",
		"policy: p\nclusterSalt: s\nidentity:\n  adoptUnbound: true\n  bogus: 1\n":               "bogus",
		"policy: p\nclusterSalt: s\nkubernetes:\n  bindingNamespace: x\n  bindingnamespace: y\n": "bindingnamespace",
		"policy: p\nclusterSalt: s\nidentity:\n  adoptUnbound: true\n  adoptUnbound: false\n":    "adoptUnbound",
		"policy: p\nclusterSalt: s\nIdentity:\n  adoptUnbound: true\n":                           "Identity",
	} {
		path := filepath.Join(dir, "v.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		c, err := app.LoadConfig(path)
		switch {
		case want == "" && (err != nil || !c.Identity.AdoptUnbound):
			t.Errorf("%q: %v", body, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: err %v, want one naming %q", body, err, want)
		}
	}
	var zero app.Config
	if zero.Identity.AdoptUnbound {
		t.Fatal("adoption on by default")
	}
}
