package app_test

// The policy's deny list against the assembled verifier: a real swtpm TPM
// and the SEV-SNP test signer join, an operator adds one deny entry of
// each kind to the policy file, the running verifier reloads it, deletes
// the node's recorded bootstrap token, and refuses the next join as
// REVOKED naming the entry.

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/policy/policytest"
)

// setPolicy writes pol (with deny, when non-nil) and waits until the
// running verifier has reloaded exactly that content.
func (r *idRig) setPolicy(t *testing.T, pol map[string]any, deny *policy.Deny) {
	t.Helper()
	p := map[string]any{}
	for k, v := range pol {
		p[k] = v
	}
	p["apiVersion"] = "latchkey/v1"
	if deny != nil {
		p["deny"] = deny
	}
	data, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	// The same content may have been in force before: count its reloads.
	want := `msg="policy reloaded" path=` + r.cfg.Policy + " policy=" + policy.Digest(data)
	before := strings.Count(r.logs.String(), want)
	if err := os.WriteFile(r.cfg.Policy, data, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "policy reload", func() bool { return strings.Count(r.logs.String(), want) > before })
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// refusedRevoked runs one join that must be refused as REVOKED naming
// entry, and leaves no token Secret.
func (r *idRig) refusedRevoked(t *testing.T, iss attest.Issuer, q ticket.Request, entry string) {
	t.Helper()
	_, err := r.agentOnce(t, iss).Get(context.Background(), q)
	var re *ticket.RefusedError
	if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_REVOKED || !strings.Contains(err.Error(), "revoked by the policy's deny list ("+entry+")") {
		t.Fatalf("join %+v: err = %v, want REVOKED naming %q", q, err, entry)
	}
	if a := r.lastDecision(t); !strings.Contains(a, "reason=REVOKED") || !strings.Contains(a, fmt.Sprintf("deny=%q", entry)) {
		t.Fatalf("audit line does not name the deny entry %q: %s", entry, a)
	}
	if n := len(r.tokenSecrets(t)); n != 0 {
		t.Fatalf("%d token secrets left after the revoked join", n)
	}
}

// denyCase is one deny entry: the policy section and the entry the
// refusal names; sweep says the Revoker finds the node's token from its
// binding records alone (an AK hash of an EK-identified machine is not on
// record: its token goes when it next tries to join).
type denyCase struct {
	name  string
	deny  policy.Deny
	entry string
	sweep bool
	// keep says which of the denied node's names a fresh first join
	// keeps (the denied one), "" for identity entries (both fresh). A
	// name entry is also tried with both names fresh: it denies the
	// machine bound to the name.
	keep string
}

// runDenyCases joins node-i/disk-i with a token, adds case i's entry,
// and checks the token is deleted and the next join refused; then the
// entry is removed and the machine is admitted again.
func runDenyCases(t *testing.T, r *idRig, pol map[string]any, iss attest.Issuer, nodes, disks []string, cases []denyCase) {
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := req(nodes[i], disks[i], false, false)
			if tk := r.join(t, iss, q); tk.Token == "" {
				t.Fatal("first join got no token")
			}
			if n := len(r.tokenSecrets(t)); n != 1 {
				t.Fatalf("%d token secrets after the join, want 1", n)
			}
			r.setPolicy(t, pol, &c.deny)
			if c.sweep {
				// The revoker logs once the deletion returned, a moment
				// after the Secret is gone: wait for both.
				logged := fmt.Sprintf(`msg="revoked bootstrap token of a denied node" node=%s`, nodes[i])
				waitFor(t, "the denied node's token to be deleted and the deletion logged", func() bool {
					return len(r.tokenSecrets(t)) == 0 && strings.Contains(r.logs.String(), logged)
				})
			}
			r.refusedRevoked(t, iss, req(nodes[i], disks[i], true, true), c.entry)
			// Its re-attestation is refused too, and recorded as refused
			// on the node's Lease, so the taint controller taints it.
			re := req(nodes[i], disks[i], true, false)
			re.Reattest = true
			r.refusedRevoked(t, iss, re, c.entry)
			r.wantRecorded(t, nodes[i], binding.DecisionRefused, "REVOKED")
			// A revoked machine claims nothing new either.
			fresh := req("fresh-"+nodes[i], "00000000-0000-4000-8000-0000000000f"+fmt.Sprint(i), false, false)
			switch c.keep {
			case "node":
				fresh.NodeName = nodes[i]
			case "disk":
				fresh.DiskUUID = disks[i]
			}
			r.refusedRevoked(t, iss, fresh, c.entry)
			// A name or disk entry denies the machine bound to it: under
			// a fresh node name and a fresh disk (all the machine
			// controls) it is refused too, and claims neither.
			if c.keep != "" {
				allFresh := req("fresh2-"+nodes[i], "00000000-0000-4000-8000-0000000000e"+fmt.Sprint(i), false, false)
				r.refusedRevoked(t, iss, allFresh, policy.BoundMachineEntry(c.entry))
				if _, err := r.bindingsStore(t).Get(context.Background(), binding.Node, allFresh.NodeName); !errors.Is(err, binding.ErrNotFound) {
					t.Fatalf("a denied machine claimed a fresh node name: %v", err)
				}
				if _, err := r.bindingsStore(t).Get(context.Background(), binding.Disk, allFresh.DiskUUID); !errors.Is(err, binding.ErrNotFound) {
					t.Fatalf("a denied machine claimed a fresh disk: %v", err)
				}
			}
			if n := strings.Count(r.logs.String(), fmt.Sprintf(`msg="revoked bootstrap token of a denied node" node=%s `, nodes[i])); n != 1 {
				t.Fatalf("the token of %s was revoked %d times, want once (sweep and refusal share the record)", nodes[i], n)
			}
			if _, err := r.bindingsStore(t).Get(context.Background(), binding.Disk, "00000000-0000-4000-8000-0000000000f"+fmt.Sprint(i)); !errors.Is(err, binding.ErrNotFound) {
				t.Fatalf("a revoked join claimed a disk: %v", err)
			}
			// Removing the entry readmits the machine: a rejoin gets its key.
			r.setPolicy(t, pol, nil)
			if tk := r.join(t, iss, req(nodes[i], disks[i], true, false)); len(tk.DiskKey) != 32 {
				t.Fatal("readmitted rejoin: no disk key")
			}
		})
	}
}

// wantRecorded checks the latest re-attestation result on node's Lease.
func (r *idRig) wantRecorded(t *testing.T, node, decision, reason string) {
	t.Helper()
	leases, ok := r.bindingsStore(t).(*binding.Leases)
	if !ok {
		t.Fatal("the rig keeps no Leases")
	}
	sts, err := leases.NodeStatuses(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.Node == node {
			if st.Last == nil || st.Last.Decision != decision || st.Last.Reason != reason {
				t.Fatalf("node %s: recorded %+v, want %s %s", node, st.Last, decision, reason)
			}
			return
		}
	}
	t.Fatalf("node %s has no bound record", node)
}

func testDisk(i int) string { return fmt.Sprintf("7d3f0a2e-4c1b-4e5a-9b8c-%012d", i) }

func TestRevokeTPM(t *testing.T) {
	sims := tpmtest.StartSiblings(t, 1)
	pol := tpmPolicy(t, sims[0])
	r := newIDRig(t, pol, true, false)
	iss := tpmIssuer(t, sims[0])
	akHash := akHashOf(t, sims[0], pol["tpm"].(tpm.Policy))

	// The machine identity as the audit line shows it.
	r.join(t, iss, req("probe", testDisk(99), false, false))
	id := machineID(t, r, "probe")
	ek := strings.TrimPrefix(id, "tpm-ek:")
	r.setPolicy(t, pol, &policy.Deny{NodeNames: []string{"probe"}})
	waitFor(t, "the probe token to go", func() bool { return len(r.tokenSecrets(t)) == 0 })
	r.setPolicy(t, pol, nil)

	nodes := []string{"tpm-n0", "tpm-n1", "tpm-n2", "tpm-n3", "tpm-n4"}
	disks := []string{testDisk(0), testDisk(1), testDisk(2), testDisk(3), testDisk(4)}
	runDenyCases(t, r, pol, iss, nodes, disks, []denyCase{
		{"nodeName", policy.Deny{NodeNames: []string{nodes[0]}}, "deny.nodeNames: " + nodes[0], true, "node"},
		{"diskUUID", policy.Deny{DiskUUIDs: []string{disks[1]}}, "deny.diskUUIDs: " + disks[1], true, "disk"},
		{"ekHash", policy.Deny{EKPublicKeyHashes: []string{ek}}, "deny.ekPublicKeyHashes: " + ek, true, ""},
		{"akHash", policy.Deny{AKPublicKeyHashes: []string{akHash}}, "deny.akPublicKeyHashes: " + akHash, false, ""},
		{"machineID", policy.Deny{MachineIDs: []string{id}}, "deny.machineIDs: " + id, true, ""},
	})
}

// akHashOf validates one attestation of sim locally to learn its AK hash.
func akHashOf(t *testing.T, sim *tpmtest.Simulator, p tpm.Policy) string {
	t.Helper()
	iss := tpmIssuer(t, sim)
	b := bytes.Repeat([]byte{7}, attest.BindingSize)
	a, err := iss.Attest(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	v, err := tpm.NewValidator(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := attest.Validate(context.Background(), v, a.Evidence(), b, a.Respond)
	if err != nil {
		t.Fatal(err)
	}
	return got.State.(*tpm.State).AKPublicKeyHash
}

func TestRevokeSNP(t *testing.T) {
	vm := snptest.New(t)
	pol := map[string]any{"snp": vm.Policy()}
	r := newIDRig(t, pol, true, false)
	chip := hex.EncodeToString(snptest.DefaultChipID)
	nodes := []string{"snp-n0", "snp-n1"}
	disks := []string{testDisk(10), testDisk(11)}
	runDenyCases(t, r, pol, vm.Issuer(), nodes, disks, []denyCase{
		{"chipID", policy.Deny{SNPChipIDs: []string{strings.ToUpper(chip)}}, "deny.snpChipIDs: " + chip, true, ""},
		{"machineID", policy.Deny{MachineIDs: []string{"snp-chip:" + chip}}, "deny.machineIDs: snp-chip:" + chip, true, ""},
	})
}

// A deny entry that names nothing real is refused at load, and the
// policy in force stays (a typo must not silently revoke nothing).
func TestDenyListStrict(t *testing.T) {
	base := "apiVersion: latchkey/v1\ntpm: {}\n"
	for body, want := range map[string]string{
		"deny:\n  nodeNames: [Worker_1]\n":                             "deny.nodeNames[0]: \"Worker_1\" is not a DNS-1123 node name",
		"deny:\n  diskUUIDs: [5E2A7C3D-1B4F-4A6E-8C9D-0F1E2D3C4B5A]\n": "deny.diskUUIDs[0]",
		"deny:\n  ekPublicKeyHashes: [abc]\n":                          "deny.ekPublicKeyHashes[0]",
		"deny:\n  akPublicKeyHashes: [sha256:00]\n":                    "deny.akPublicKeyHashes[0]",
		"deny:\n  snpChipIDs: [abcd]\n":                                "deny.snpChipIDs[0]",
		"deny:\n  machineIDs: [chip:0011]\n":                           "deny.machineIDs[0]",
		"deny:\n  nodenames: [a]\n":                                    "nodenames",
		"deny:\n  nodeNames: [a]\n  nodeNames: [b]\n":                  "nodeNames",
		"deny:\n  nodeNames: [a]\n  machineIDs: [\"snp-chip:" + strings.Repeat("ab", 64) + "/host-data:" + strings.Repeat("cd", 32) + "\"]\n": "",
	} {
		_, err := policy.Load([]byte(base+body), policy.Deps{})
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", body, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: err %v, want one containing %q", body, err, want)
		}
	}
}

// The CSR approver is told no token for a denied node (or a node of a
// denied machine), so a CSR made with its token before the deny entry
// arrived is not signed after.
func TestApproverTokensOfDeniedNode(t *testing.T) {
	store, err := binding.NewDir(binding.DirConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "tpm-ek:sha256:" + strings.Repeat("ab", 32)
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, err := store.Claim(ctx, binding.Node, n, id); err != nil {
			t.Fatal(err)
		}
		if err := store.SetToken(ctx, n, id, "abc"+n[1:]+"de"); err != nil {
			t.Fatal(err)
		}
	}
	// Another machine's node keeps its token through the name entry.
	other := "tpm-ek:sha256:" + strings.Repeat("cd", 32)
	if _, err := store.Claim(ctx, binding.Node, "n9", other); err != nil {
		t.Fatal(err)
	}
	if err := store.SetToken(ctx, "n9", other, "abc9de"); err != nil {
		t.Fatal(err)
	}
	load := func(deny string) policy.Source {
		snap, err := policy.Load([]byte("apiVersion: latchkey/v1\ntpm: {}\n"+deny), policy.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		return policytest.Static(snap)
	}
	for _, c := range []struct {
		deny string
		want map[string]string
	}{
		{"", map[string]string{"n1": "abc1de", "n2": "abc2de"}},
		// A name entry denies the machine bound to it, under its other
		// names too.
		{"deny:\n  nodeNames: [n1]\n", map[string]string{"n1": "", "n2": "", "n9": "abc9de"}},
		{"deny:\n  ekPublicKeyHashes: [\"sha256:" + strings.Repeat("ab", 32) + "\"]\n", map[string]string{"n1": "", "n2": ""}},
	} {
		nt := app.NodeTokens{Store: store, Policy: load(c.deny)}
		for node, want := range c.want {
			if got, err := nt.NodeTokenID(ctx, node); err != nil || got != want {
				t.Errorf("deny %q: token of %s = %q, %v; want %q", c.deny, node, got, err, want)
			}
		}
	}
}
