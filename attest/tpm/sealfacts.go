package tpm

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest"
)

// JoinPhaseWord is the boot-phase word the agent joins after: it runs
// after sysinit.target, and an offline unlock unseals at that same point
// of the next boot, so a grant is sealed to PCR 11 as it stood right after
// this word was measured.
const JoinPhaseWord = "sysinit"

// Clock is the quote's TPMS_CLOCK_INFO, signed by the AK with the rest of
// the quote. TPM2_Quote obfuscates resetCount and restartCount for a key
// outside the endorsement and platform hierarchies; latchkey's AK is an
// endorsement-hierarchy key (keys.go), so they are the TPM's.
type Clock struct {
	// ClockMS is the TPM's clock in milliseconds (it advances while the
	// TPM is powered and never goes back unless Safe is false).
	ClockMS uint64
	// ResetCount counts TPM Resets (boots) since the last TPM2_Clear.
	ResetCount uint32
	// RestartCount counts TPM Restarts (resume) since the last reset.
	RestartCount uint32
	// Safe is the TPM's statement that no larger clock value was ever
	// reported (false after a power loss the TPM could not record).
	Safe bool
}

func clockOf(q *tpm2.TPMSAttest) Clock {
	c := q.ClockInfo
	return Clock{ClockMS: c.Clock, ResetCount: c.ResetCount, RestartCount: c.RestartCount, Safe: bool(c.Safe)}
}

var _ attest.Sealer = (*State)(nil)

// SealFacts implements attest.Sealer: SealPCRs and the quote's clock.
// The verifier cannot see an AK's hierarchy; the quoted resetCount is the
// TPM's because the AK was made by the agent whose measurements this
// quote proved (the genuine agent makes it in the endorsement hierarchy:
// keys.go), as every other fact of an accepted quote rests on them.
func (s *State) SealFacts(quotedAtJoin bool) (attest.SealFacts, error) {
	pcrs, err := s.SealPCRs(quotedAtJoin)
	if err != nil {
		return attest.SealFacts{}, err
	}
	return attest.SealFacts{PCRs: pcrs, ResetCount: s.Clock.ResetCount, ClockMS: s.Clock.ClockMS}, nil
}

// SealPCRs are the PCR values an offline grant is sealed to: the quoted
// ones, with PCR 11 at the join point. With event logs that is the value
// replayed up to and including the JoinPhaseWord measurement
// (Boot.PCR11AtJoin), whatever phase the quote was made in; a PCR 11
// replay that never passed that word gives none. Without logs the quoted
// value is used only when the caller says the quote was made at the join
// point (quotedAtJoin); a re-attestation without logs gives none.
func (s *State) SealPCRs(quotedAtJoin bool) (map[uint32][]byte, error) {
	pcrs := make(map[uint32][]byte, len(s.PCRs))
	for i, v := range s.PCRs {
		pcrs[uint32(i)] = append([]byte(nil), v[:]...)
	}
	if _, ok := s.PCRs[pcrKernel]; ok {
		switch {
		case s.Boot != nil && s.Boot.PCR11AtJoinKnown:
			pcrs[pcrKernel] = append([]byte(nil), s.Boot.PCR11AtJoin[:]...)
		case s.Boot != nil:
			return nil, fmt.Errorf("pcr 11 never passed the %q phase word (phase %q), so its join-point value is unknown", JoinPhaseWord, s.Boot.Phase)
		case !quotedAtJoin:
			return nil, errors.New("the evidence carries no event log to derive pcr 11's join-point value from")
		}
	}
	return pcrs, nil
}

// joinPoint replays PCR 11 (recs, then the unlogged phase suffix) up to
// and including the first JoinPhaseWord measurement among the phase
// words, which start at record first (after systemd-stub's sections).
// Every record before it replayed, with the rest, to the quoted value, so
// the intermediate value is as verified as the quote.
func joinPoint(recs []record, first int, suffix string) ([sha256.Size]byte, bool) {
	var v [sha256.Size]byte
	for j, r := range recs {
		v = Extend(v, r.digest)
		if w, ok := phaseWord(r); ok && j >= first && w == JoinPhaseWord {
			return v, true
		}
	}
	if suffix == "" {
		return [sha256.Size]byte{}, false
	}
	for w := range strings.SplitSeq(suffix, ":") {
		v = Extend(v, sha256.Sum256([]byte(w)))
		if w == JoinPhaseWord {
			return v, true
		}
	}
	return [sha256.Size]byte{}, false
}
