package wire

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
)

// DefaultPCRs are quoted when the issuer's Config.PCRs is empty: the UEFI
// firmware, its configuration, option ROMs, boot loader, GPT, Secure Boot
// state (0-7), the boot loader's measurements of kernel, initrd and command
// line (8, 9), and systemd-stub's unified kernel image and command line
// (11, 12) and shim's MOK state (14). Left out on purpose: 10 (IMA, changes
// at run time), 13 (system extensions), 15 (systemd's machine-specific
// measurements) and 16-23 (debug and application PCRs).
var DefaultPCRs = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 14}

// pcrSelectSize is the bitmap length of a 24-PCR bank.
const pcrSelectSize = 3

// CheckPCRs refuses an index outside 0..23 or listed twice.
func CheckPCRs(pcrs []int) error {
	seen := make(map[int]bool, len(pcrs))
	for _, p := range pcrs {
		if p < 0 || p > MaxPCR {
			return fmt.Errorf("pcr %d out of range 0..%d", p, MaxPCR)
		}
		if seen[p] {
			return fmt.Errorf("pcr %d listed twice", p)
		}
		seen[p] = true
	}
	return nil
}

// Selection is the SHA-256 bank selection of pcrs.
func Selection(pcrs []int) tpm2.TPMLPCRSelection {
	bitmap := make([]byte, pcrSelectSize)
	for _, p := range pcrs {
		bitmap[p/8] |= 1 << (p % 8)
	}
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{
		{Hash: tpm2.TPMAlgSHA256, PCRSelect: bitmap},
	}}
}

// Selected returns the ascending SHA-256 PCR indices of sel, refusing any
// other bank and any index above 23.
func Selected(sel tpm2.TPMLPCRSelection) ([]int, error) {
	if len(sel.PCRSelections) != 1 || sel.PCRSelections[0].Hash != tpm2.TPMAlgSHA256 {
		return nil, errors.New("selection is not exactly the sha256 bank")
	}
	var pcrs []int
	for i, b := range sel.PCRSelections[0].PCRSelect {
		for bit := range 8 {
			if b&(1<<bit) == 0 {
				continue
			}
			if p := i*8 + bit; p <= MaxPCR {
				pcrs = append(pcrs, p)
			} else {
				return nil, fmt.Errorf("pcr %d out of range", p)
			}
		}
	}
	return pcrs, nil
}

// PCRDigest is what TPM2_Quote signs over the PCRs: SHA-256 of the values
// concatenated in ascending index order.
func PCRDigest(pcrs []int, values map[int][]byte) []byte {
	sorted := slices.Sorted(slices.Values(pcrs))
	h := sha256.New()
	for _, p := range sorted {
		h.Write(values[p])
	}
	return h.Sum(nil)
}
