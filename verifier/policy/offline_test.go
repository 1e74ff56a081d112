package policy

import (
	"strings"
	"testing"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

var snpSection = "snp:\n  measurements: [\"" + digestA + digestA[:32] + "\"]\n"

func TestOfflineUnlockAccepted(t *testing.T) {
	snap, err := Load([]byte(tpmPolicy(digestA)+"  offlineUnlock: {maxBoots: 3, maxHours: 72}\n"), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	got, ok := snap.OfflineFor(latchkeyv1.Variant_VARIANT_TPM)
	if !ok || got != (OfflineUnlock{MaxBoots: 3, MaxHours: 72}) {
		t.Fatalf("OfflineFor(tpm) = %+v, %v", got, ok)
	}
	if _, ok := snap.OfflineFor(latchkeyv1.Variant_VARIANT_SNP); ok {
		t.Fatal("snp allows offline unlock")
	}
	if s := snap.OfflineSummary(); s != "offline unlock on for tpm (at most 3 boot(s) within 72 hour(s) of an attestation)" {
		t.Fatalf("summary %q", s)
	}
}

// The zero value is off: no section, an empty one, and explicit zeros.
func TestOfflineUnlockOffByDefault(t *testing.T) {
	for name, extra := range map[string]string{
		"absent": "",
		"empty":  "  offlineUnlock: {}\n",
		"zeros":  "  offlineUnlock: {maxBoots: 0, maxHours: 0}\n",
	} {
		t.Run(name, func(t *testing.T) {
			snap, err := Load([]byte(tpmPolicy(digestA)+extra), Deps{})
			if err != nil {
				t.Fatal(err)
			}
			if o, ok := snap.OfflineFor(latchkeyv1.Variant_VARIANT_TPM); ok {
				t.Fatalf("offline unlock on: %+v", o)
			}
			if s := snap.OfflineSummary(); s != "offline unlock off" {
				t.Fatalf("summary %q", s)
			}
		})
	}
}

func TestOfflineUnlockRefusals(t *testing.T) {
	cases := map[string]struct{ section, want string }{
		"boots zero":     {"{maxBoots: 0, maxHours: 5}", "tpm.offlineUnlock.maxBoots: must be at least 1 when offlineUnlock is set"},
		"hours absent":   {"{maxBoots: 2}", "tpm.offlineUnlock.maxHours: must be at least 1 when offlineUnlock is set"},
		"boots too many": {"{maxBoots: 1001, maxHours: 5}", "tpm.offlineUnlock.maxBoots: 1001 is above the limit of 1000"},
		"hours too many": {"{maxBoots: 1, maxHours: 8761}", "tpm.offlineUnlock.maxHours: 8761 is above the limit of 8760"},
		"unknown key":    {"{maxBoots: 1, maxHours: 1, maxDays: 1}", `unknown field "tpm.offlineUnlock.maxDays"`},
		"case variant":   {"{maxboots: 1, maxHours: 1}", `unknown field "tpm.offlineUnlock.maxboots"`},
		"duplicate":      {"{maxBoots: 1, maxBoots: 2, maxHours: 1}", `already set`},
		"negative":       {"{maxBoots: -1, maxHours: 1}", "tpm.offlineUnlock.maxBoots"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load([]byte(tpmPolicy(digestA)+"  offlineUnlock: "+c.section+"\n"), Deps{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// SEV-SNP has no TPM to seal to: the section is refused with the reason,
// also when its bounds are zero, and also next to a tpm section that may
// carry one.
func TestOfflineUnlockSNPRefused(t *testing.T) {
	for name, p := range map[string]string{
		"snp only":  "apiVersion: latchkey/v1\n" + snpSection + "  offlineUnlock: {maxBoots: 1, maxHours: 1}\n",
		"snp zeros": "apiVersion: latchkey/v1\n" + snpSection + "  offlineUnlock: {}\n",
		"with tpm":  tpmPolicy(digestA) + "  offlineUnlock: {maxBoots: 1, maxHours: 1}\n" + snpSection + "  offlineUnlock: {maxBoots: 1, maxHours: 1}\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load([]byte(p), Deps{})
			want := "snp.offlineUnlock: SEV-SNP without a vTPM cannot seal; remove offlineUnlock from the snp section"
			if err == nil || err.Error() != want {
				t.Fatalf("err = %v, want %q", err, want)
			}
		})
	}
	// The same snp section without offlineUnlock loads.
	if _, err := Load([]byte("apiVersion: latchkey/v1\n"+snpSection), Deps{}); err != nil {
		t.Fatal(err)
	}
}
