package snp_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/snptest"
)

// The machine identity is the whole CHIP_ID, with HOST_DATA appended only
// when the policy says the platform sets it per VM; a masked CHIP_ID
// names no machine.
func TestMachineID(t *testing.T) {
	hostData := bytes.Repeat([]byte{0x5a}, 32)
	s := snptest.NewWithOptions(t, snptest.Options{HostData: hostData})
	chip := "snp-chip:" + hex.EncodeToString(snptest.DefaultChipID)
	for _, tc := range []struct {
		bind bool
		want string
	}{
		{false, chip},
		{true, chip + "/host-data:" + hex.EncodeToString(hostData)},
	} {
		p := s.Policy()
		p.BindHostData = tc.bind
		b := newBinding(t)
		got, err := attest.Validate(context.Background(), newValidator(t, p, nil), s.Evidence(b), b, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.MachineID != tc.want {
			t.Errorf("bindHostData %v: MachineID %q, want %q", tc.bind, got.MachineID, tc.want)
		}
	}
	masked := snptest.NewWithOptions(t, snptest.Options{ChipID: make([]byte, 64)})
	b := newBinding(t)
	got, err := attest.Validate(context.Background(), newValidator(t, masked.Policy(), nil), masked.Evidence(b), b, nil)
	if err != nil || got.MachineID != "" {
		t.Fatalf("masked chip: MachineID %q (%v), want none", got.MachineID, err)
	}
}
