package tpm

import (
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
)

// JoinPhaseWord is the boot-phase word the agent joins after (bootlog).
const JoinPhaseWord = bootlog.JoinPhaseWord

// Clock is the quote's TPMS_CLOCK_INFO, signed by the AK with the rest of
// the quote. ResetCount and RestartCount are the TPM's only for an AK in
// the endorsement or platform hierarchy, as latchkey's agent makes it
// (ErrResetCountObfuscated).
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

// ErrResetCountObfuscated: the quoted resetCount cannot be the TPM's.
// TPM2_Quote obfuscates resetCount (adds a value derived from the
// hierarchy's proof and the key's name, uniform over 32 bits) for a
// signing key outside the endorsement and platform hierarchies (TPM 2.0
// Part 3, 18.1). latchkey's agent makes its AK in the endorsement
// hierarchy; a quote by an AK made elsewhere (an older agent) carries a
// count no TPM reaches, and a boot bound counted from it would be
// arbitrary, so no grant is built from it.
var ErrResetCountObfuscated = errors.New("the quote's resetCount is implausibly large: the attestation key is not an endorsement-hierarchy key, so its quote's resetCount is obfuscated and no boot bound can be counted from it")

// maxPlausibleResetCount is far above any real TPM's boot count (16
// million boots) and below all but 1 in 256 obfuscated values.
const maxPlausibleResetCount = 1 << 24

// SealFacts implements attest.Sealer: SealPCRs and the quote's clock.
// The AK is not known to be an endorsement-hierarchy key from its
// public area alone; the verifier relies on the measured agent making it
// there and refuses a grant for a resetCount no TPM reaches
// (ErrResetCountObfuscated).
func (s *State) SealFacts(quotedAtJoin bool) (attest.SealFacts, error) {
	pcrs, err := s.SealPCRs(quotedAtJoin)
	if err != nil {
		return attest.SealFacts{}, err
	}
	if s.Clock.ResetCount > maxPlausibleResetCount {
		return attest.SealFacts{}, ErrResetCountObfuscated
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
