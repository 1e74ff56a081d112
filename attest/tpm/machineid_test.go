package tpm_test

import (
	"context"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// The machine identity bindings use is the trusted EK's SPKI hash, the
// same whichever way the EK is trusted, and different for another TPM of
// the same CA; with a pinned AK it is the AK's.
func TestMachineID(t *testing.T) {
	f := newFixture(t)
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	want := "tpm-ek:" + f.measured.EKPublicKeyHashes[0]
	for name, p := range map[string]tpm.Policy{"ek certificate": f.caPolicy(), "ek hash": f.hashPolicy()} {
		got, err := attest.Validate(context.Background(), newValidator(t, p), a.Evidence(), binding, a.Respond)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.MachineID != want {
			t.Errorf("%s: MachineID %q, want %q", name, got.MachineID, want)
		}
	}
	got, err := attest.Validate(context.Background(), newValidator(t, f.hashPolicy()), a.Evidence(), binding, a.Respond)
	if err != nil {
		t.Fatal(err)
	}
	akHash := stateOf(t, got).AKPublicKeyHash
	pinned, err := attest.Validate(context.Background(), newValidator(t, tpm.Policy{PCRs: f.measured.PCRs, AKPublicKeyHashes: []string{akHash}}), a.Evidence(), binding, noRoundTrip(t))
	if err != nil || pinned.MachineID != "tpm-ak:"+akHash {
		t.Fatalf("pinned ak: MachineID %q (%v), want tpm-ak:%s", machineIDOf(pinned), err, akHash)
	}

	sibs := tpmtest.StartSiblings(t, 2)
	var ids []string
	for _, sim := range sibs {
		m := measure(t, sim) // before the issuer: swtpm serves one connection at a time
		iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device})
		if err != nil {
			t.Fatal(err)
		}
		b := newBinding(t)
		sa, err := iss.Attest(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		v, err := attest.Validate(context.Background(), newValidator(t, tpm.Policy{PCRs: m.PCRs, EKCARoots: sim.EKCARootsPEM}), sa.Evidence(), b, sa.Respond)
		sa.Close()
		iss.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.MachineID)
	}
	if ids[0] == ids[1] || sibs[0].EKCARootsPEM[0] != sibs[1].EKCARootsPEM[0] {
		t.Fatalf("siblings of one CA: identities %v", ids)
	}
}

func machineIDOf(v *attest.Verified) string {
	if v == nil {
		return ""
	}
	return v.MachineID
}
