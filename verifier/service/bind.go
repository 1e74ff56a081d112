package service

import (
	"context"
	"errors"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// bind ties the Hello's disk UUID (always) and node name (when the
// verifier mints tokens) to the attested machine, before any key is
// derived or token minted. The rules:
//
//   - The evidence must name a stable machine identity (MachineID);
//     without one nothing can be bound (IDENTITY_MISMATCH).
//   - A first join (rejoin=false) claims each name: a name with no record,
//     or a released one, is recorded for this identity; a name bound to
//     another identity is refused (IDENTITY_MISMATCH). The agent draws a
//     first boot's disk UUID at random, so nobody can claim it earlier.
//   - A rejoin needs each name's record to hold this identity. A released
//     record is claimed (the operator let a replacement take it). A name
//     with no record at all belongs to a disk or node set up before
//     identity binding: it is adopted only when AdoptUnbound is set (the
//     upgrade procedure), and refused otherwise (IDENTITY_MISMATCH).
//   - A record that cannot be read or written is UNAVAILABLE (transient).
//
// A first join with two names (disk and node) looks at both before it
// claims either, so a join refused for its node name leaves its disk
// unclaimed; a race between the look and the claim is settled by the
// claim, which is atomic. A first join with one name (disk-only mode)
// claims at once: the claim itself refuses a name bound to another
// identity and returns one bound to this machine, so a look first would
// only cost a store round trip (with etcd, a quorum read).
func (s *Service) bind(ctx context.Context, hello *latchkeyv1.Hello, v *attest.Verified, out *outcome) error {
	id := v.MachineID
	if id == "" {
		return attest.Refuse(latchkeyv1.Reason_IDENTITY_MISMATCH,
			"the evidence names no stable machine identity (an SNP report with CHIP_ID masked?), so its disk and node name cannot be bound")
	}
	kinds := []binding.Kind{binding.Disk}
	names := []string{hello.GetDiskUuid()}
	if s.cfg.Minter != nil {
		kinds, names = append(kinds, binding.Node), append(names, hello.GetNodeName())
	}
	if hello.GetRejoin() {
		for i, k := range kinds {
			if err := s.refusal(k, names[i], s.checkRejoin(ctx, k, names[i], id, out), out); err != nil {
				return err
			}
		}
		return nil
	}
	// With two names a first join looks before it claims, so a join
	// refused for one name leaves the other unclaimed, and a name already
	// bound to this machine (a retried first join) costs one read. With
	// one name the claim answers alone.
	mine := make([]bool, len(kinds))
	for i := 0; len(kinds) > 1 && i < len(kinds); i++ {
		var err error
		mine[i], err = s.precheck(ctx, kinds[i], names[i], id)
		if err := s.refusal(kinds[i], names[i], err, out); err != nil {
			return err
		}
	}
	for i, k := range kinds {
		if mine[i] {
			continue
		}
		err := s.claim(ctx, k, names[i], id, hello, out) // generation.go
		if err := s.refusal(k, names[i], err, out); err != nil {
			return err
		}
	}
	return nil
}

// precheck finds a first join's name bound to another identity without
// claiming anything; mine reports the name is bound to id already.
func (s *Service) precheck(ctx context.Context, kind binding.Kind, name, id string) (mine bool, err error) {
	r, err := s.cfg.Bindings.Get(ctx, kind, name)
	switch {
	case errors.Is(err, binding.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	case !r.Bound():
		return false, nil
	}
	return true, binding.Check(r, id)
}

// refusal turns a binding error into the join's refusal.
func (s *Service) refusal(kind binding.Kind, name string, err error, out *outcome) error {
	var mm *binding.MismatchError
	switch {
	case errors.As(err, &mm):
		out.boundIdentity = mm.Bound
		return attest.Refuse(latchkeyv1.Reason_IDENTITY_MISMATCH,
			"%s %s is bound to another machine; an operator releases it with `latchkey-verifier bindings release --%s %s`", kind, name, kind, name)
	case err != nil:
		var r *attest.Refusal
		if errors.As(err, &r) {
			return err
		}
		return attest.Refuse(latchkeyv1.Reason_UNAVAILABLE, "%s binding record: %w", kind, err)
	}
	return nil
}

// checkRejoin checks (or, when released or adoptable, claims) one name
// of a rejoin.
func (s *Service) checkRejoin(ctx context.Context, kind binding.Kind, name, id string, out *outcome) error {
	r, err := s.cfg.Bindings.Get(ctx, kind, name)
	switch {
	case errors.Is(err, binding.ErrNotFound):
		if !s.cfg.AdoptUnbound {
			return attest.Refuse(latchkeyv1.Reason_IDENTITY_MISMATCH,
				"%s %s has no binding record (set up before identity binding); the verifier adopts such names only with identity.adoptUnbound", kind, name)
		}
		if _, err := s.cfg.Bindings.Claim(ctx, kind, name, id); err != nil {
			return err
		}
		out.adopted = append(out.adopted, string(kind))
		return nil
	case err != nil:
		return err
	case !r.Bound():
		_, err := s.cfg.Bindings.Claim(ctx, kind, name, id)
		return err
	}
	s.noteGeneration(kind, r, out) // generation.go
	return binding.Check(r, id)
}
