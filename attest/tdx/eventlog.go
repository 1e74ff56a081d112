package tdx

import (
	"bytes"
	"crypto/sha512"
	"encoding/hex"
	"strings"

	"github.com/google/go-eventlog/ccel"
	"github.com/google/go-eventlog/extract"
	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// replayCCEL runs check 9: the CC event log, when the evidence carries
// one, replays to the quote's RTMRs (RTMR[i] is the log's MR index i+1),
// and only then is what its events say copied into st.
//
// go-eventlog's ReplayAndExtract checks the table, replays, and extracts
// what a GRUB boot measured (checking each command against its digest).
// A failed extraction refuses when RTMR[2] holds measurements and none
// are systemd-stub's UKI sections: a UKI boot has no GRUB events (its
// command line is the one passed to systemd-stub), and a boot that
// measured nothing into RTMR[2] has nothing GRUB could have measured. The component view (readBoot) is read from the
// replayed events whatever the boot loader.
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
	fw, extractErr := ccel.ReplayAndExtract(ev.CCELTable, ev.CCEL, bank, extract.Opts{Loader: extract.GRUB})
	if fw == nil {
		return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log: %w", extractErr)
	}
	// The same parse and replay as above, which passed: the events.
	events, err := tcg.ParseAndReplay(ev.CCEL, bank.MRs(), tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log: %w", err)
	}
	b, err := readBoot(events)
	if err != nil {
		return err
	}
	switch {
	case extractErr == nil && fw.GetLinuxKernel() != nil:
		// The boot loader measures the command line with its NUL.
		st.KernelCmdline, st.HasKernelCmdline = strings.TrimSuffix(fw.GetLinuxKernel().GetCommandLine(), "\x00"), true
	case extractErr != nil && len(b.UKISections) == 0 && b.kernelEvents > 0:
		return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log: %w", extractErr)
	case b.CmdlinePassed:
		st.KernelCmdline, st.HasKernelCmdline = b.Cmdline, true
	}
	st.EventLog, st.Boot = true, b
	st.replayed = replayedRTMRs(events, q.GetTdQuoteBody().GetRtmrs())
	for _, app := range b.Applications {
		st.EFIApps = append(st.EFIApps, hex.EncodeToString(app.Digest[:]))
	}
	return nil
}

// replayedRTMRs says which quoted RTMRs the replayed events fold to
// exactly. go-eventlog's replay passes an RTMR the log has no event for
// whatever its quoted value, so a judged RTMR is checked here: one with
// no event must be all zeros.
func replayedRTMRs(events []tcg.Event, quoted [][]byte) (out [numRTMRs]bool) {
	var fold [numRTMRs][]byte
	for i := range fold {
		fold[i] = make([]byte, sha512.Size384)
	}
	for _, e := range events {
		r := int(e.MRIndex()) - 1
		if e.UntrustedType() == tcg.NoAction || r < 0 || r >= numRTMRs {
			continue
		}
		h := sha512.New384()
		h.Write(fold[r])
		h.Write(e.ReplayedDigest())
		fold[r] = h.Sum(nil)
	}
	for i := range out {
		out[i] = i < len(quoted) && bytes.Equal(fold[i], quoted[i])
	}
	return out
}
