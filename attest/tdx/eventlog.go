package tdx

import (
	"encoding/hex"
	"strings"

	"github.com/google/go-eventlog/ccel"
	"github.com/google/go-eventlog/extract"
	"github.com/google/go-eventlog/register"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// replayCCEL runs check 9: the CC event log, when the evidence carries
// one, replays to the quote's RTMRs (RTMR[i] is the log's MR index i+1),
// and only then is what its events say copied into st.
func replayCCEL(ev *wire.Evidence, q *pb.QuoteV4, st *State) (err error) {
	if ev.CCEL == nil {
		return nil
	}
	defer func() { // go-eventlog panics on some malformed events
		if r := recover(); r != nil {
			err = attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log: malformed event")
		}
	}()
	bank := register.RTMRBank{}
	for i, r := range q.GetTdQuoteBody().GetRtmrs() {
		bank.RTMRs = append(bank.RTMRs, register.RTMR{Index: i, Digest: r})
	}
	fw, err := ccel.ReplayAndExtract(ev.CCELTable, ev.CCEL, bank, extract.Opts{Loader: extract.GRUB})
	if err != nil {
		return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log: %w", err)
	}
	st.EventLog = true
	if k := fw.GetLinuxKernel(); k != nil {
		// The boot loader measures the command line with its NUL.
		st.KernelCmdline, st.HasKernelCmdline = strings.TrimSuffix(k.GetCommandLine(), "\x00"), true
	}
	for _, app := range fw.GetEfi().GetApps() {
		st.EFIApps = append(st.EFIApps, hex.EncodeToString(app.GetDigest()))
	}
	return nil
}
