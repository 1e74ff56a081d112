package wire_test

import (
	"testing"

	"github.com/google/go-sev-guest/kds"

	"github.com/latchkey/latchkey/attest/snp/wire"
)

// TCBFromVersion reads the bytes kds.DecomposeTCBVersion reads: the
// agent decomposes its own TCB without linking kds, and the verifier
// compares with kds's decomposition, so the two must agree on every
// component. Each value sets one component's byte alone, so a shift
// taken from the wrong byte shows.
func TestTCBFromVersionMatchesKDS(t *testing.T) {
	for _, v := range []uint64{
		0, 1, 0xff, 0xff00, 0xff0000, 0xff000000, 0xff00000000, 0xff0000000000,
		0xff000000000000, 0xff00000000000000, 0x7308000000000003, 0xffffffffffffffff,
	} {
		p := kds.DecomposeTCBVersion(kds.TCBVersion(v))
		want := wire.TCB{Bootloader: p.BlSpl, TEE: p.TeeSpl, SNP: p.SnpSpl, Microcode: p.UcodeSpl}
		if got := wire.TCBFromVersion(v); got != want {
			t.Errorf("TCBFromVersion(%#x) = %+v, kds says %+v", v, got, want)
		}
	}
}
