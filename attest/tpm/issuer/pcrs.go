package issuer

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/attest/tpm/wire"
)

// readPCRs reads the SHA-256 values of pcrs. A TPM returns at most eight
// digests per TPM2_PCR_Read, so it asks again for what is still missing;
// every round must make progress.
func readPCRs(tp transport.TPM, pcrs []int) (map[int][]byte, error) {
	values := make(map[int][]byte, len(pcrs))
	missing := slices.Clone(pcrs)
	for len(missing) > 0 {
		rsp, err := tpm2.PCRRead{PCRSelectionIn: wire.Selection(missing)}.Execute(tp)
		if err != nil {
			return nil, fmt.Errorf("read pcrs: %w", err)
		}
		got, err := wire.Selected(rsp.PCRSelectionOut)
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
