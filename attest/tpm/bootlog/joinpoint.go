package bootlog

import (
	"crypto/sha256"
	"strings"
)

// JoinPhaseWord is the boot-phase word the agent joins after: it runs
// after sysinit.target, and an offline unlock unseals at that same point
// of the next boot, so a grant is sealed to PCR 11 as it stood right after
// this word was measured.
const JoinPhaseWord = "sysinit"

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
