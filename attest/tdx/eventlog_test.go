package tdx

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/abi"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// moduleDir is where the go command keeps go-tdx-guest's module, whose
// testdata (not embedded by its testdata package) holds the CCEL files.
func moduleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/google/go-tdx-guest").Output()
	if err != nil {
		t.Fatalf("go list go-tdx-guest: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// go-tdx-guest ships a quote from a Container-Optimized OS TD on real
// TDX hardware with that boot's CC event log (ACPI CCEL table and log).
func cosEvidence(t *testing.T) (quote *pb.QuoteV4, table, log []byte) {
	t.Helper()
	dir := filepath.Join(moduleDir(t), "testing", "testdata", "ccel")
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	raw := read("cos-113-tdx-quote.dat")
	q, err := abi.QuoteToProto(raw[:wire.QuoteLength(raw)])
	if err != nil {
		t.Fatal(err)
	}
	return q.(*pb.QuoteV4), read("ccel_table.dat"), wire.TrimCCEL(read("ccel_data.dat"))
}

const cosCmdlinePrefix = "/syslinux/vmlinuz.A init=/usr/lib/systemd/systemd rootwait ro noresume"

// TestReplayRealCCEL replays the recorded log against the recorded quote's
// RTMRs: it replays, and the state holds the measured command line.
func TestReplayRealCCEL(t *testing.T) {
	q, table, log := cosEvidence(t)
	st := &State{}
	if err := replayCCEL(&wire.Evidence{CCELTable: table, CCEL: log}, q, st); err != nil {
		t.Fatalf("replay: %v", err)
	}
	if !st.EventLog || !st.HasKernelCmdline || !strings.HasPrefix(st.KernelCmdline, cosCmdlinePrefix) || strings.HasSuffix(st.KernelCmdline, "\x00") || len(st.EFIApps) != 2 {
		t.Fatalf("state %+v", st)
	}
	// The log of one boot does not replay to another's RTMRs.
	other, _ := abi.QuoteToProto(realQuote)
	err := replayCCEL(&wire.Evidence{CCELTable: table, CCEL: log}, other.(*pb.QuoteV4), &State{})
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
}

// cosSigned is the fake signer's validator and a quote of the fake chain
// carrying the recorded boot's RTMRs, so its log replays.
func cosSigned(t *testing.T, edit func(*Policy)) (*signed, *pb.TDQuoteBody, []byte, []byte) {
	t.Helper()
	q, table, log := cosEvidence(t)
	rtmrs := q.GetTdQuoteBody().GetRtmrs()
	x := newSigned(t, tdxtest.Collateral{}, func(p *Policy) {
		p.RTMRs = nil
		for _, r := range rtmrs {
			p.RTMRs = append(p.RTMRs, []string{hex.EncodeToString(r)})
		}
		if edit != nil {
			edit(p)
		}
	})
	body := x.s.Body()
	body.Rtmrs = rtmrs
	return x, body, table, log
}

func (x *signed) validateWithLog(t *testing.T, body *pb.TDQuoteBody, table, log []byte) (*attest.Verified, error) {
	t.Helper()
	binding := bytes.Repeat([]byte{0x42}, attest.BindingSize)
	rd, _ := wire.ReportData(binding)
	ev, err := wire.EncodeEvidence(wire.Evidence{Quote: x.s.Quote(body, rd), CCELTable: table, CCEL: log})
	if err != nil {
		t.Fatal(err)
	}
	return attest.Validate(context.Background(), x.v, ev, binding, nil)
}

func TestSignedEventLog(t *testing.T) {
	q, table, cosLog := cosEvidence(t)
	s := &State{}
	if err := replayCCEL(&wire.Evidence{CCELTable: table, CCEL: cosLog}, q, s); err != nil {
		t.Fatal(err)
	}
	cmdline := s.KernelCmdline
	t.Run("accepted with its command line", func(t *testing.T) {
		x, body, table, log := cosSigned(t, func(p *Policy) { p.KernelCmdlines = []string{"other", cmdline} })
		ver, err := x.validateWithLog(t, body, table, log)
		if err != nil {
			t.Fatalf("Validate: %v", err)
		}
		if st := ver.State.(*State); st.KernelCmdline != cmdline {
			t.Fatalf("cmdline %q", st.KernelCmdline)
		}
	})
	t.Run("command line not listed", func(t *testing.T) {
		x, body, table, log := cosSigned(t, func(p *Policy) { p.KernelCmdlines = []string{"console=ttyS0"} })
		_, err := x.validateWithLog(t, body, table, log)
		wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "measured kernel command line \""+cosCmdlinePrefix)
	})
	t.Run("no log", func(t *testing.T) {
		x, body, _, _ := cosSigned(t, func(p *Policy) { p.KernelCmdlines = []string{cmdline} })
		_, err := x.validateWithLog(t, body, nil, nil)
		wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "no replayed event log measures one")
	})
	t.Run("rewritten command line", func(t *testing.T) {
		// Slip-past: edit the logged command line to a listed one, keep
		// the quote (its RTMRs hold the measured one).
		x, body, table, log := cosSigned(t, func(p *Policy) { p.KernelCmdlines = []string{strings.Replace(cmdline, "rootwait", "rootWAIT", 1)} })
		edited := bytes.Replace(bytes.Clone(log), []byte("rootwait"), []byte("rootWAIT"), 1)
		if bytes.Equal(edited, log) || len(edited) != len(cosLog) {
			t.Fatal("log edit did not apply")
		}
		_, err := x.validateWithLog(t, body, table, edited)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
	t.Run("log of another boot", func(t *testing.T) {
		x := newSigned(t, tdxtest.Collateral{}, nil)
		_, table, log := cosEvidence(t)
		_, err := x.validateWithLog(t, x.s.Body(), table, log)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
}
