package service

import (
	"context"
	"errors"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/policy"
)

// reattest runs a re-attestation (Hello.purpose = PURPOSE_REATTEST): a
// node that has joined proves again what it runs. The rules:
//
//   - It never releases a key or a token: the ticket it ends with carries
//     no disk key and no token (nothing derived, nothing minted), only the
//     renewal or withdrawal of an offline grant (offline.go), which opens
//     nothing without the sealed copy on the node's own TPM; so a
//     re-attestation can gain a caller nothing a join would not.
//   - It never claims a name: the node (or, in disk-only mode, the disk)
//     must be bound to the attested machine already, else
//     IDENTITY_MISMATCH.
//   - Only an authenticated result is recorded. The evidence is first
//     verified (the validator's Verify step: trusted key, signature,
//     session binding, log replay); a failure there is refused and not
//     recorded, because the node name in the Hello is then
//     unauthenticated and recording it would let anyone taint any node.
//     The binding check follows, then the join's other checks
//     (reattestDecision: deny list, generation, policy); the decision
//     (attested, or refused with the reason) is written to the node's
//     Lease (binding.AttestationRecorder) before the answer is sent.
//   - No field of the Hello reaches a record before that decision
//     passed: the disk's key generation is written only then.
//   - A record that cannot be written is UNAVAILABLE: the agent retries,
//     and the taint controller sees a stale Lease only after its deadline.
func (s *Service) reattest(ctx context.Context, stream *joinStream, snap *policy.Snapshot, hello *latchkeyv1.Hello, out *outcome) error {
	if hello.GetRequestToken() {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "a re-attestation cannot ask for a token")
	}
	val, ok := snap.Validators[hello.GetVariant()]
	if !ok {
		return attest.Refuse(latchkeyv1.Reason_UNKNOWN_VARIANT, "variant %s is not enabled by the policy", hello.GetVariant())
	}
	b, err := atls.PeerBinding(stream.Context(), hello)
	if err != nil {
		return err
	}
	start := s.cfg.Now()
	v, err := val.Verify(ctx, hello.GetEvidence(), b, s.challenger(stream, out))
	out.validation = s.cfg.Now().Sub(start)
	s.cfg.Metrics.ObserveValidation(hello.GetVariant(), out.validation)
	if err != nil {
		return err
	}
	out.verified = v
	s.evalShadow(hello.GetVariant(), v, out)
	if err := s.checkBound(ctx, hello, v, out); err != nil {
		return err
	}
	out.bound = true
	decision := s.reattestDecision(ctx, snap, hello, val, v, out)
	if err := s.recordAttestation(ctx, hello, v, decision, out); err != nil {
		if decision != nil {
			return errors.Join(decision, err)
		}
		return attest.Refuse(latchkeyv1.Reason_UNAVAILABLE, "record re-attestation: %w", err)
	}
	if decision != nil {
		return decision
	}
	s.reattestGeneration(ctx, hello, v) // generation.go
	// No disk key, no token: at most the offline grant's renewal or
	// withdrawal, which release nothing by themselves (offline.go).
	t := &latchkeyv1.Ticket{}
	s.offlineTicket(ctx, snap, hello, v, false, t)
	return s.handover(ctx, stream, t)
}

// reattestDecision is the verdict on authenticated, bound evidence: every
// check a join makes that does not concern issuing, in the join's order.
// The deny list (REVOKED, recorded as refused so the taint controller
// taints the node), the generation the Hello names (the one number it
// may write), then the policy: val's CheckPolicy on the state its Verify
// returned. nil is attested.
func (s *Service) reattestDecision(ctx context.Context, snap *policy.Snapshot, hello *latchkeyv1.Hello, val attest.Validator,
	v *attest.Verified, out *outcome) error {
	if err := s.checkRevoked(ctx, snap, hello, v, out); err != nil {
		return err
	}
	if err := s.checkGeneration(hello); err != nil {
		return err
	}
	return val.CheckPolicy(v.State)
}

// checkBound requires the node (with a Minter) and the disk to be bound to
// the attested machine already; a re-attestation never claims.
func (s *Service) checkBound(ctx context.Context, hello *latchkeyv1.Hello, v *attest.Verified, out *outcome) error {
	if v.MachineID == "" {
		return attest.Refuse(latchkeyv1.Reason_IDENTITY_MISMATCH, "the evidence names no stable machine identity")
	}
	kinds := []binding.Kind{binding.Disk}
	names := []string{hello.GetDiskUuid()}
	if s.cfg.Minter != nil {
		kinds, names = append(kinds, binding.Node), append(names, hello.GetNodeName())
	}
	for i, k := range kinds {
		r, err := s.cfg.Bindings.Get(ctx, k, names[i])
		switch {
		case errors.Is(err, binding.ErrNotFound) || (err == nil && !r.Bound()):
			return attest.Refuse(latchkeyv1.Reason_IDENTITY_MISMATCH, "%s %s has no bound record; a re-attestation needs a joined node", k, names[i])
		case err == nil:
			err = binding.Check(r, v.MachineID)
		}
		if err := s.refusal(k, names[i], err, out); err != nil {
			return err
		}
	}
	return nil
}

// recordAttestation writes the decision to the node's Lease when the
// store keeps node records (Kubernetes mode); disk-only mode has no node
// to taint and records only the audit line.
func (s *Service) recordAttestation(ctx context.Context, hello *latchkeyv1.Hello, v *attest.Verified, policyErr error, out *outcome) error {
	rec, ok := s.cfg.Bindings.(binding.AttestationRecorder)
	if !ok || s.cfg.Minter == nil {
		return nil
	}
	a := binding.Attestation{Time: s.cfg.Now(), EvidenceDigest: out.digest, Decision: binding.DecisionAttested, Reason: "NONE",
		ShadowDecision: out.shadowDecision, ShadowReason: out.shadowReason}
	if policyErr != nil {
		a.Decision, a.Reason = binding.DecisionRefused, attest.ReasonOf(policyErr).String()
	}
	return rec.RecordAttestation(ctx, hello.GetNodeName(), v.MachineID, a)
}

// purposeLabel is the audit line's purpose: "join" or "reattest".
func purposeLabel(h *latchkeyv1.Hello) string {
	if h.GetPurpose() == latchkeyv1.Purpose_PURPOSE_REATTEST {
		return "reattest"
	}
	return "join"
}
