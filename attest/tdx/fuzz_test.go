package tdx

import (
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
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

// FuzzReadLog feeds arbitrary CC event logs to the component reading: it
// never panics, and what it reads keeps to the RTMRs the roles belong to
// (applications in RTMR[1], systemd-stub's sections and command line and
// the unexplained measurements in RTMR[2]) and matches the view.
func FuzzReadLog(f *testing.F) {
	boot := tdxtest.UKIBoot{
		UKI:      [48]byte{1},
		Sections: []tdxtest.Section{{Name: ".linux", Data: []byte("k")}, {Name: ".cmdline", Data: []byte("c")}},
		Cmdline:  "console=hvc0", Passed: true, Extra: [][48]byte{{2}},
		GPT: append([]byte("EFI PART"), make([]byte, 8)...),
	}
	log := tdxtest.TDVFLog(boot).Bytes()
	f.Add(log)
	f.Add(log[:len(log)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, log []byte) {
		events, b, err := ReadLog(log)
		if err != nil {
			return
		}
		want := map[Role]int{RoleApplication: rtmrBoot, RoleSectionName: rtmrKernel, RoleSectionData: rtmrKernel, RoleCmdline: rtmrKernel, RoleUnexplained: rtmrKernel}
		count := map[Role]int{}
		for _, e := range events {
			if r, ok := want[e.Role]; ok && e.RTMR != r {
				t.Fatalf("role %d in RTMR[%d]", e.Role, e.RTMR)
			}
			count[e.Role]++
		}
		if count[RoleApplication] != len(b.Applications) || count[RoleSectionName] != len(b.UKISections) ||
			count[RoleSectionData] != len(b.UKISections) || count[RoleUnexplained] != len(b.Unexplained) ||
			(count[RoleCmdline] == 1) != b.CmdlinePassed {
			t.Fatalf("roles %v do not match the view %+v", count, b)
		}
	})
}
