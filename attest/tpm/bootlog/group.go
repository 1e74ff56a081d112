package bootlog

import (
	"crypto"
	"maps"
	"slices"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/latchkey/latchkey/attest/tpm/wire"
)

// groupSystemd groups systemd's events by PCR. It refuses an event that
// extends a PCR only firmware measures: systemd runs after the
// separators, so such an event could only mask a firmware measurement.
func groupSystemd(sd []wire.SystemdEvent) (map[int][]wire.SystemdEvent, error) {
	sdByPCR := map[int][]wire.SystemdEvent{}
	for i, e := range sd {
		if e.PCR <= pcrSecureBoot {
			return nil, mismatch("systemd event log record %d extends pcr %d, which only firmware measures", i, e.PCR)
		}
		sdByPCR[e.PCR] = append(sdByPCR[e.PCR], e)
	}
	return sdByPCR, nil
}

// touchedPCRs is every PCR either log extends, in order. It refuses a PCR
// the quote does not cover: its events could not be checked, and no
// measurement may escape the replay.
func touchedPCRs(pcrs map[int][]byte, byPCR map[int][]tcg.Event, sdByPCR map[int][]wire.SystemdEvent) ([]int, error) {
	touched := slices.Sorted(maps.Keys(byPCR))
	for p := range sdByPCR {
		if !slices.Contains(touched, p) {
			touched = append(touched, p)
		}
	}
	slices.Sort(touched)
	for _, p := range touched {
		if _, ok := pcrs[p]; !ok {
			return nil, mismatch("event log extends pcr %d, which the quote does not cover", p)
		}
	}
	return touched, nil
}

// splitReplay divides the touched PCRs between go-eventlog's replay
// (fwOnly: the PCRs only firmware extends and this package does not
// interpret) and this package's own replay (own: PCRs systemd also
// extends, and the ones whose events it interprets), so each PCR is
// replayed by the code that understands its events.
func splitReplay(pcrs map[int][]byte, touched []int, sdByPCR map[int][]wire.SystemdEvent) (fwOnly []register.MR, own []int) {
	for _, p := range touched {
		if _, both := sdByPCR[p]; both || p == pcrBootApps || p == PCRKernel || p == pcrKernelArgs {
			own = append(own, p)
			continue
		}
		fwOnly = append(fwOnly, register.PCR{Index: p, Digest: pcrs[p], DigestAlg: crypto.SHA256})
	}
	return fwOnly, own
}

// groupByPCR lists the unverified firmware events of each PCR in log
// order; it drops EV_NO_ACTION events, which extend nothing.
func groupByPCR(raw []tcg.Event) map[int][]tcg.Event {
	out := map[int][]tcg.Event{}
	for _, e := range raw {
		if e.Type == tcg.NoAction {
			continue
		}
		out[e.Index] = append(out[e.Index], e)
	}
	return out
}
