package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/verifier/policy"
)

// A swtpm machine joins through the assembled verifier whose policy
// allows offline unlock. The quote's resetCount is obfuscated (latchkey's
// AK is an owner-hierarchy key; tpm.ErrResetCountObfuscated), so no boot
// bound can be built from it: the join succeeds, its ticket carries no
// grant, and the audit line says why, instead of a grant whose boot bound
// would be arbitrary.
func TestTPMJoinWithOfflineUnlockNeedsARealResetCount(t *testing.T) {
	ctx := context.Background()
	sim := tpmtest.Start(t)
	ref, err := tpm.Measure(ctx, sim.Device, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	sec := policy.TPMSection{Policy: tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM},
		OfflineUnlock: &policy.OfflineUnlock{MaxBoots: 2, MaxHours: 24}}
	_, cfg := verifierFiles(t, map[string]any{"tpm": sec}, randomSecret(), "test-cluster")
	r := startRig(t, sim, cfg)
	tk, err := r.agent(t, r.issuer(t), 30*time.Second).Get(ctx, worker())
	if err != nil {
		t.Fatal(err)
	}
	if len(tk.GetDiskKey()) != 32 || tk.GetOfflineGrant() != nil || tk.GetWithdrawOffline() {
		t.Fatalf("ticket: key %d bytes, grant %v, withdraw %v", len(tk.GetDiskKey()), tk.GetOfflineGrant(), tk.GetWithdrawOffline())
	}
	want := `msg="no offline grant from this attestation" node=node-1 disk_uuid=` + diskA + ` purpose=join reason="` + tpm.ErrResetCountObfuscated.Error() + `"`
	if !strings.Contains(r.logs.String(), want) {
		t.Fatalf("audit: want %q in\n%s", want, r.logs)
	}
}
