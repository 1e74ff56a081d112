package snp_test

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-sev-guest/abi"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	snpwire "github.com/latchkey/latchkey/attest/snp/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// FuzzDecodeEvidence feeds arbitrary bytes to the evidence decoding path,
// which runs on unauthenticated input before any signature check. It must
// never panic, must fail only with MALFORMED, and what it accepts must
// have the shape Validate relies on. Run briefly in CI:
//
//	go test ./attest/snp/ -run '^$' -fuzz FuzzDecodeEvidence -fuzztime 30s -fuzzminimizetime 2s
//
// (Without -fuzzminimizetime the engine spends up to a minute shrinking
// each new 6 KiB input and executes nothing meanwhile.)
func FuzzDecodeEvidence(f *testing.F) {
	s := snptest.New(f)
	binding := make([]byte, attest.BindingSize)
	f.Add(s.Evidence(binding))
	f.Add(s.EvidenceWithoutTable(binding))
	f.Add(rawEvidence(s.Report(binding), s.CertTable()[:100]))
	f.Add(rawEvidence(s.Report(binding)[:600], nil))
	table := s.CertTable()
	binary.LittleEndian.PutUint32(table[20:24], 0xffffffff)
	f.Add(rawEvidence(s.Report(binding), table))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := snpwire.DecodeEvidence(data)
		if err != nil {
			if r := attest.ReasonOf(err); r != latchkeyv1.Reason_MALFORMED {
				t.Fatalf("DecodeEvidence failed with %v: %v", r, err)
			}
			return
		}
		if len(ev.Raw) != abi.ReportSize || ev.Report == nil {
			t.Fatalf("accepted a report of %d bytes", len(ev.Raw))
		}
		if len(ev.Endorsement) > len(ev.CertTable) {
			t.Fatalf("endorsement of %d bytes from a %d-byte table", len(ev.Endorsement), len(ev.CertTable))
		}
	})
}
