package app_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/verifier/policy"
)

// A swtpm machine joins through the assembled verifier whose policy
// allows offline unlock: the ticket carries a grant whose boot bound
// counts from the TPM's own resetCount (the AK is an endorsement-hierarchy
// key, so the quote's resetCount is not obfuscated), with the policy's
// bounds, and the audit line names them.
func TestTPMJoinWithOfflineUnlockGrantsFromTheTPMsResetCount(t *testing.T) {
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
	reset := tpmResetCount(t, sim)
	g := tk.GetOfflineGrant()
	if len(tk.GetDiskKey()) != 32 || g == nil || tk.GetWithdrawOffline() {
		t.Fatalf("ticket: key %d bytes, grant %v, withdraw %v", len(tk.GetDiskKey()), g, tk.GetWithdrawOffline())
	}
	if g.GetResetCount() != reset || g.GetMaxBoots() != 2 || g.GetMaxHours() != 24 {
		t.Fatalf("grant: reset count %d (the TPM's %d), bounds %d boots %d hours", g.GetResetCount(), reset, g.GetMaxBoots(), g.GetMaxHours())
	}
	want := fmt.Sprintf(` offline_max_boots=2 offline_max_hours=24 sealed_pcrs=%s tpm_reset_count=%d `, sealedList(testPCRs), reset)
	if !strings.Contains(r.logs.String(), `msg="offline grant" node=node-1 disk_uuid=`+diskA+` purpose=join `) ||
		!strings.Contains(r.logs.String(), want) {
		t.Fatalf("audit: want the grant line with %q in\n%s", want, r.logs)
	}
}

// tpmResetCount is the simulator's resetCount as TPM2_ReadClock reports it.
func tpmResetCount(t *testing.T, sim *tpmtest.Simulator) uint32 {
	t.Helper()
	tp, err := tpm.OpenDevice(sim.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	now, err := tpm2.ReadClock{}.Execute(tp)
	if err != nil {
		t.Fatal(err)
	}
	return now.CurrentTime.ClockInfo.ResetCount
}

// sealedList is the audit line's sealed_pcrs for pcrs ("0,7,14").
func sealedList(pcrs []int) string {
	s := make([]string, len(pcrs))
	for i, p := range pcrs {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ",")
}
