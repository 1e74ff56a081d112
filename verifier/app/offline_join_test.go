package app_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/policy"
)

// offlineUnlockFiles is verifierFiles for sim's PCRs of testPCRs, with
// offline unlock allowed for 2 boots and 24 hours.
func offlineUnlockFiles(tb testing.TB, sim *tpmtest.Simulator, salt string) (string, *app.Config) {
	tb.Helper()
	ref, err := issuer.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		tb.Fatal(err)
	}
	sec := policy.TPMSection{Policy: tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM},
		OfflineUnlock: &policy.OfflineUnlock{MaxBoots: 2, MaxHours: 24}}
	return verifierFiles(tb, map[string]any{"tpm": sec}, randomSecret(), salt)
}

// A swtpm machine joins through the assembled verifier whose policy
// allows offline unlock. The ticket's grant carries the TPM's own reset
// count and the policy's bounds, and it is real: the TPM seals the disk
// key for it (Seal checks the grant's signature first) and releases the
// key for it in this boot.
func TestTPMJoinWithOfflineUnlockGrants(t *testing.T) {
	ctx := context.Background()
	sim := tpmtest.Start(t)
	_, cfg := offlineUnlockFiles(t, sim, "test-cluster")
	r := startRig(t, sim, cfg)
	tk, err := r.agent(t, r.issuer(t), 30*time.Second).Get(ctx, worker())
	if err != nil {
		t.Fatal(err)
	}
	g := tk.GetOfflineGrant()
	if len(tk.GetDiskKey()) != 32 || g == nil || tk.GetWithdrawOffline() {
		t.Fatalf("ticket: key %d bytes, grant %v, withdraw %v", len(tk.GetDiskKey()), g, tk.GetWithdrawOffline())
	}
	tp, err := issuer.OpenDevice(sim.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	now, err := tpm2.ReadClock{}.Execute(tp)
	if err != nil {
		t.Fatal(err)
	}
	if g.GetResetCount() != now.CurrentTime.ClockInfo.ResetCount || g.GetMaxBoots() != 2 || g.GetMaxHours() != 24 {
		t.Fatalf("grant: reset %d (tpm %d), bounds %d/%d", g.GetResetCount(), now.CurrentTime.ClockInfo.ResetCount, g.GetMaxBoots(), g.GetMaxHours())
	}
	sealed, err := offline.Seal(tp, tk.GetDiskKey(), g)
	if err != nil {
		t.Fatal(err)
	}
	key, st, err := offline.Unseal(tp, sealed, g)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(key, tk.GetDiskKey()) || st.MaxBoots != 2 {
		t.Fatalf("unsealed a different key, status %+v", st)
	}
	want := `msg="offline grant" node=node-1 disk_uuid=` + diskA
	if !strings.Contains(r.logs.String(), want) {
		t.Fatalf("audit: want %q in\n%s", want, r.logs)
	}
}
