package service

import (
	"context"
	"errors"
	"github.com/latchkey/latchkey/internal/logkey"
	"strconv"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/keys"
)

// Master-secret generations in the ticket (docs/operations.md, "Rotating
// the master secret"). disk_key is always the current generation's key.
// A Hello whose disk header names an older generation the verifier still
// serves also gets that generation's key (previous_disk_key), so the
// agent can unlock and rewrap to the current one. A Hello naming a
// generation the verifier does not serve is refused as
// KEY_GENERATION_RETIRED (checkGeneration, before any claim): no key it
// could send opens that disk, and a wrong key must never look like a
// right one.

// ticketKeys are the key fields of one ticket.
type ticketKeys struct {
	key, previous       []byte
	generation, prevGen uint32
	hasPrevious         bool
}

// diskKeys derives the ticket's keys for hello's disk.
func (s *Service) diskKeys(hello *latchkeyv1.Hello) (*ticketKeys, error) {
	k := s.cfg.Keys
	t := &ticketKeys{generation: k.Current()}
	if hello.DiskKeyGeneration != nil {
		named := hello.GetDiskKeyGeneration()
		if err := s.checkGeneration(hello); err != nil {
			return nil, err
		}
		if named != t.generation {
			prev, err := k.DiskKeyAt(named, hello.GetDiskUuid())
			if err != nil {
				return nil, err
			}
			t.previous, t.prevGen, t.hasPrevious = prev, named, true
		}
	}
	key, err := k.DiskKey(hello.GetDiskUuid())
	if err != nil {
		t.clear()
		return nil, err
	}
	t.key = key
	return t, nil
}

// checkGeneration refuses a Hello naming a master-secret generation this
// verifier does not serve. It runs before any claim or record write, so a
// refused join leaves no trace. The detail says what is true: a
// generation below the current one was served once and retired
// (generations are added, each made current, in rising order); any other
// (above the current one, or over binding.MaxGeneration) is unknown to
// this verifier.
func (s *Service) checkGeneration(hello *latchkeyv1.Hello) error {
	if hello.DiskKeyGeneration == nil {
		return nil
	}
	k, named := s.cfg.Keys, hello.GetDiskKeyGeneration()
	switch {
	case k.Serves(named):
		return nil
	case named < k.Current():
		return attest.Refuse(latchkeyv1.Reason_KEY_GENERATION_RETIRED,
			"disk %s is keyed under master-secret generation %d, which this verifier no longer serves (it serves %s); "+
				"add generation %d back to masterSecrets to open it", hello.GetDiskUuid(), named, servedList(k), named)
	}
	return attest.Refuse(latchkeyv1.Reason_KEY_GENERATION_RETIRED,
		"disk %s names master-secret generation %d, which is unknown to this verifier (it serves %s)",
		hello.GetDiskUuid(), named, servedList(k))
}

// fill copies the generation fields into the ticket (the current key is
// set by buildTicket).
func (t *ticketKeys) fill(tk *latchkeyv1.Ticket) {
	tk.KeyGeneration = t.generation
	if t.hasPrevious {
		tk.PreviousDiskKey, tk.PreviousKeyGeneration = t.previous, t.prevGen
	}
}

func (t *ticketKeys) clear() {
	clear(t.key)
	clear(t.previous)
}

// recordGeneration writes to the disk's binding record the generation
// this join's disk is keyed under (joinGeneration). It is written before the ticket leaves, so `secret retire`
// never misses a disk that holds a key of the generation it retires. A
// store that cannot record generations records nothing.
func (s *Service) recordGeneration(ctx context.Context, hello *latchkeyv1.Hello, out *outcome) error {
	rec, ok := s.cfg.Bindings.(binding.GenerationRecorder)
	if !ok || out.generationRecorded {
		return nil
	}
	err := rec.SetKeyGeneration(ctx, hello.GetDiskUuid(), out.verified.MachineID, s.joinGeneration(hello))
	var mm *binding.MismatchError
	switch {
	case errors.As(err, &mm):
		out.boundIdentity = mm.Bound
		return attest.Refuse(latchkeyv1.Reason_IDENTITY_MISMATCH, "disk %s was rebound during the join", hello.GetDiskUuid())
	case err != nil:
		return attest.Refuse(latchkeyv1.Reason_UNAVAILABLE, "record key generation on disk binding: %w", err)
	}
	return nil
}

// joinGeneration is the generation a join's disk is recorded under: the
// one its Hello named; for a first boot naming none, the current one (the
// agent writes it into the new header); for a rejoin naming none, 0. A
// rejoin names no generation only from an agent that predates
// generations (it wrote and reads generation-0 headers) or from the
// key-only stage (no header the agent can read): recording the current
// generation for those would let `secret retire` retire the secret their
// disk still needs, so they are recorded as the generation every
// pre-generation header has, and keep generation 0 from being retired.
func (s *Service) joinGeneration(hello *latchkeyv1.Hello) uint32 {
	switch {
	case hello.DiskKeyGeneration != nil:
		return hello.GetDiskKeyGeneration()
	case hello.GetRejoin():
		return 0
	}
	return s.cfg.Keys.Current()
}

// claim claims one name of a first join; a disk is claimed with its key
// generation when the store can record both at once (one write instead of
// three calls). The generation is recorded for a Hello whose generation
// the verifier serves only: a refused one must leave no trace of it.
func (s *Service) claim(ctx context.Context, kind binding.Kind, name, id string, hello *latchkeyv1.Hello, out *outcome) error {
	gc, ok := s.cfg.Bindings.(binding.GenerationClaimer)
	gen := s.joinGeneration(hello)
	if kind != binding.Disk || !ok || !s.cfg.Keys.Serves(gen) {
		_, err := s.cfg.Bindings.Claim(ctx, kind, name, id)
		return err
	}
	_, made, err := gc.ClaimGeneration(ctx, name, id, gen)
	out.generationRecorded = made && err == nil
	return err
}

// noteGeneration marks the generation recorded when the disk record a
// rejoin read already holds the one the join would record, so the
// steady-state rejoin costs no extra read.
func (s *Service) noteGeneration(kind binding.Kind, r binding.Record, out *outcome) {
	if kind == binding.Disk && r.KeyGeneration != nil && *r.KeyGeneration == s.joinGeneration(out.hello) {
		out.generationRecorded = true
	}
}

// reattestGeneration records on the disk's binding the generation a
// re-attestation names: the open disk's, after any rewrap at its boot, so
// the record (and `secret retire`) follows a rewrap without waiting for
// the next boot. It runs only after the re-attestation passed every check
// (verified, bound, not denied, a generation this verifier serves, the
// policy), and the store checks that the disk is bound to this machine
// and the number is in range; a failure to record is logged and never
// fails the re-attestation.
func (s *Service) reattestGeneration(ctx context.Context, hello *latchkeyv1.Hello, v *attest.Verified) {
	rec, ok := s.cfg.Bindings.(binding.GenerationRecorder)
	if !ok || hello.DiskKeyGeneration == nil {
		return
	}
	if err := rec.SetKeyGeneration(ctx, hello.GetDiskUuid(), v.MachineID, hello.GetDiskKeyGeneration()); err != nil {
		s.log.Warn("re-attestation: could not record the disk's key generation", logkey.DiskUUID, hello.GetDiskUuid(),
			logkey.KeyGeneration, hello.GetDiskKeyGeneration(), logkey.Error, err.Error())
	}
}

func servedList(k *keys.Deriver) string {
	s := ""
	for i, g := range k.Generations() {
		if i > 0 {
			s += ", "
		}
		s += strconv.FormatUint(uint64(g.Generation), 10)
	}
	return s
}
