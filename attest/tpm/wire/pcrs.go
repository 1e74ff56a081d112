package tpm

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// DefaultPCRs are quoted when IssuerConfig.PCRs is empty: the UEFI
// firmware, its configuration, option ROMs, boot loader, GPT, Secure Boot
// state (0-7), the boot loader's measurements of kernel, initrd and command
// line (8, 9), and systemd-stub's unified kernel image and command line
// (11, 12) and shim's MOK state (14). Left out on purpose: 10 (IMA, changes
// at run time), 13 (system extensions), 15 (systemd's machine-specific
// measurements) and 16-23 (debug and application PCRs).
var DefaultPCRs = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 14}

// pcrSelectSize is the bitmap length of a 24-PCR bank.
const pcrSelectSize = 3

// checkPCRs refuses an index outside 0..23 or listed twice.
func checkPCRs(pcrs []int) error {
	seen := make(map[int]bool, len(pcrs))
	for _, p := range pcrs {
		if p < 0 || p > maxPCR {
			return fmt.Errorf("pcr %d out of range 0..%d", p, maxPCR)
		}
		if seen[p] {
			return fmt.Errorf("pcr %d listed twice", p)
		}
		seen[p] = true
	}
	return nil
}

// selection is the SHA-256 bank selection of pcrs.
func selection(pcrs []int) tpm2.TPMLPCRSelection {
	bitmap := make([]byte, pcrSelectSize)
	for _, p := range pcrs {
		bitmap[p/8] |= 1 << (p % 8)
	}
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{
		{Hash: tpm2.TPMAlgSHA256, PCRSelect: bitmap},
	}}
}

// selected returns the ascending SHA-256 PCR indices of sel, refusing any
// other bank and any index above 23.
func selected(sel tpm2.TPMLPCRSelection) ([]int, error) {
	if len(sel.PCRSelections) != 1 || sel.PCRSelections[0].Hash != tpm2.TPMAlgSHA256 {
		return nil, errors.New("selection is not exactly the sha256 bank")
	}
	var pcrs []int
	for i, b := range sel.PCRSelections[0].PCRSelect {
		for bit := range 8 {
			if b&(1<<bit) == 0 {
				continue
			}
			if p := i*8 + bit; p <= maxPCR {
				pcrs = append(pcrs, p)
			} else {
				return nil, fmt.Errorf("pcr %d out of range", p)
			}
		}
	}
	return pcrs, nil
}

// readPCRs reads the SHA-256 values of pcrs. A TPM returns at most eight
// digests per TPM2_PCR_Read, so it asks again for what is still missing;
// every round must make progress.
func readPCRs(tp transport.TPM, pcrs []int) (map[int][]byte, error) {
	values := make(map[int][]byte, len(pcrs))
	missing := slices.Clone(pcrs)
	for len(missing) > 0 {
		rsp, err := tpm2.PCRRead{PCRSelectionIn: selection(missing)}.Execute(tp)
		if err != nil {
			return nil, fmt.Errorf("read pcrs: %w", err)
		}
		got, err := selected(rsp.PCRSelectionOut)
		if err != nil || len(got) == 0 || len(got) != len(rsp.PCRValues.Digests) {
			return nil, errors.New("read pcrs: tpm returned an unusable selection")
		}
		for i, p := range got {
			d := rsp.PCRValues.Digests[i].Buffer
			if !slices.Contains(missing, p) || len(d) != sha256.Size {
				return nil, fmt.Errorf("read pcrs: unexpected digest for pcr %d", p)
			}
			values[p] = slices.Clone(d)
			missing = slices.DeleteFunc(missing, func(q int) bool { return q == p })
		}
	}
	return values, nil
}

// pcrDigest is what TPM2_Quote signs over the PCRs: SHA-256 of the values
// concatenated in ascending index order.
func pcrDigest(pcrs []int, values map[int][]byte) []byte {
	sorted := slices.Sorted(slices.Values(pcrs))
	h := sha256.New()
	for _, p := range sorted {
		h.Write(values[p])
	}
	return h.Sum(nil)
}
