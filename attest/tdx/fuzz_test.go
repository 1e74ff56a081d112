package tdx

import (
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// FuzzDecode feeds arbitrary evidence to the decoding check: it never
// panics, and whatever it refuses it refuses as MALFORMED.
func FuzzDecode(f *testing.F) {
	ev, err := wire.EncodeEvidence(wire.Evidence{Quote: realQuote})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ev)
	f.Add(ev[:700])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, evidence []byte) {
		q, _, err := decode(evidence)
		if err != nil {
			if r := attest.ReasonOf(err); r != latchkeyv1.Reason_MALFORMED {
				t.Fatalf("refused as %s: %v", r, err)
			}
			return
		}
		if len(q.GetTdQuoteBody().GetRtmrs()) != numRTMRs {
			t.Fatal("decoded quote without four RTMRs")
		}
	})
}
