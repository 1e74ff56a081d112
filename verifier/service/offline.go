package service

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
)

// Offline unlock (docs/offline-unlock.md), the verifier's half:
//
//   - Every successful ticket (join, rejoin, re-attestation) carries an
//     offline grant when the policy in force allows offline unlock for
//     the variant: the verified quote's PCRs (PCR 11 at the join point,
//     attest.Sealer) and TPMS_CLOCK_INFO, the policy's bounds, and a
//     policy ref binding it to the attested machine and the disk, signed
//     by the GrantSigner. A grant that cannot be built (a re-attestation
//     whose PCR 11 join-point value is not derivable, a quote whose
//     resetCount no TPM reaches: tpm.ErrResetCountObfuscated) is left
//     out with a log line: the node keeps any grant it holds, which
//     expires by
//     its own bounds.
//   - A ticket withdraws the grant the node says it holds
//     (withdraw_offline) when the policy no longer allows one, or when the
//     disk is keyed under an older master-secret generation (a rotation
//     changes the grant key, and the sealed copy holds the old disk key;
//     the same ticket carries a grant under the new key). A refusal
//     withdraws it for the reasons withdrawsOffline lists.
//   - Hello.offline drives audit lines, metrics and, through the node's
//     Lease, the offline taint (verifier/reattest), and only once the
//     evidence is verified: an unauthenticated claim is not recorded.
//     It never decides whether a key is released.

// GrantSigner signs offline grants with the grant key of the verifier's
// current master-secret generation (offline.Authorizer).
type GrantSigner interface {
	Grant(req offline.GrantRequest) (*latchkeyv1.OfflineGrant, error)
}

// withdrawsOffline lists the refusals that withdraw a node's offline
// grant: the machine is revoked or no longer the one bound to the name,
// the disk's key generation is retired, or the policy no longer accepts
// what the node runs (its measurements, components, key trust, role or
// variant). Refusals of malformed, replayed or unverifiable evidence and
// transient failures do not: they say nothing about the node, and an
// offline grant must survive a verifier that cannot decide.
func withdrawsOffline(r latchkeyv1.Reason) bool {
	switch r {
	case latchkeyv1.Reason_REVOKED, latchkeyv1.Reason_IDENTITY_MISMATCH, latchkeyv1.Reason_KEY_GENERATION_RETIRED,
		latchkeyv1.Reason_UNKNOWN_VARIANT, latchkeyv1.Reason_PCR_MISMATCH, latchkeyv1.Reason_UNTRUSTED_AK,
		latchkeyv1.Reason_ROLE_NOT_ALLOWED, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED,
		latchkeyv1.Reason_SECURE_BOOT_REQUIRED, latchkeyv1.Reason_PCR_SIGNATURE_INVALID,
		latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED, latchkeyv1.Reason_DEBUG_POLICY, latchkeyv1.Reason_TCB_TOO_OLD,
		latchkeyv1.Reason_VMPL_MISMATCH, latchkeyv1.Reason_GUEST_POLICY_MISMATCH:
		return true
	}
	return false
}

// offlineTicket sets t's offline fields for a successful join
// (quotedAtJoin) or re-attestation of hello, whose evidence v verified.
func (s *Service) offlineTicket(ctx context.Context, snap *policy.Snapshot, hello *latchkeyv1.Hello, v *attest.Verified, quotedAtJoin bool, t *latchkeyv1.Ticket) {
	bounds, allowed := snap.OfflineFor(hello.GetVariant())
	held := hello.GetOffline().GetHeld()
	rotated := hello.DiskKeyGeneration != nil && hello.GetDiskKeyGeneration() < s.cfg.Keys.Current()
	switch {
	case !held:
		// Nothing to withdraw: the agent reports a grant it holds
		// (Hello.offline.held) at every contact, and an agent without
		// offline unlock must not be sent what it cannot read.
	case rotated:
		t.WithdrawOffline = true
		s.withdrew(ctx, hello, "the disk is keyed under an older master-secret generation")
	case !allowed:
		t.WithdrawOffline = true
		s.withdrew(ctx, hello, "the policy no longer allows offline unlock")
	}
	if !allowed {
		return
	}
	t.OfflineGrant = s.grant(ctx, hello, v, bounds, quotedAtJoin)
}

// grant builds and signs the grant, or logs why there is none.
func (s *Service) grant(ctx context.Context, hello *latchkeyv1.Hello, v *attest.Verified, b policy.OfflineUnlock, quotedAtJoin bool) *latchkeyv1.OfflineGrant {
	attrs := []any{logkey.Node, hello.GetNodeName(), logkey.DiskUUID, hello.GetDiskUuid(), logkey.Purpose, purposeLabel(hello)}
	sealer, ok := v.State.(attest.Sealer)
	switch {
	case s.cfg.Grants == nil:
		s.log.WarnContext(ctx, "no offline grant: the policy allows offline unlock but this verifier has no grant key", attrs...)
		return nil
	case !ok:
		s.log.WarnContext(ctx, "no offline grant: the evidence cannot seal a key", append(attrs, logkey.Variant, hello.GetVariant().String())...)
		return nil
	}
	facts, err := sealer.SealFacts(quotedAtJoin)
	if err != nil {
		s.log.WarnContext(ctx, "no offline grant from this attestation", append(attrs, logkey.Reason, err.Error())...)
		return nil
	}
	g, err := s.cfg.Grants.Grant(offline.GrantRequest{
		PolicyRef: offline.PolicyRef([]byte(v.MachineID), hello.GetDiskUuid()),
		PCRs:      facts.PCRs, ResetCount: facts.ResetCount, ClockMS: facts.ClockMS,
		MaxBoots: b.MaxBoots, MaxHours: b.MaxHours,
	})
	if err != nil {
		s.log.ErrorContext(ctx, "no offline grant: signing failed", append(attrs, logkey.Error, err.Error())...)
		return nil
	}
	s.cfg.Metrics.OfflineGrant(metrics.OfflineGranted)
	s.log.InfoContext(ctx, "offline grant", append(attrs, logkey.Identity, v.MachineID,
		logkey.OfflineMaxBoots, b.MaxBoots, logkey.OfflineMaxHours, b.MaxHours, logkey.SealedPCRs, pcrList(facts.PCRs),
		logkey.TPMResetCount, facts.ResetCount, logkey.TPMClockMS, facts.ClockMS)...)
	return g
}

// withdrew audits and counts a withdrawal of the grant the node said it
// held; a refused node that holds none is told too (the refusal's flag
// depends on its reason alone), but nothing is counted.
func (s *Service) withdrew(ctx context.Context, hello *latchkeyv1.Hello, why string) {
	if !hello.GetOffline().GetHeld() {
		return
	}
	s.cfg.Metrics.OfflineGrant(metrics.OfflineWithdrawn)
	s.log.InfoContext(ctx, "offline grant withdrawn", logkey.Node, hello.GetNodeName(), logkey.DiskUUID, hello.GetDiskUuid(),
		logkey.Purpose, purposeLabel(hello), logkey.Reason, why)
}

// noteOffline handles what the Hello says about the node's offline grant,
// once the join or re-attestation ended with err. Only a node whose
// evidence verified is heard; only one bound to its name is recorded for
// the offline taint, and not when this is the re-attestation that clears
// it.
func (s *Service) noteOffline(ctx context.Context, out *outcome, err error) {
	hello := out.hello
	st := hello.GetOffline()
	if st == nil || out.verified == nil {
		return
	}
	if err != nil && withdrawsOffline(reasonOf(err)) {
		s.withdrew(ctx, hello, "refused: "+reasonOf(err).String())
	}
	attrs := []any{logkey.Node, hello.GetNodeName(), logkey.DiskUUID, hello.GetDiskUuid(), logkey.Identity, out.verified.MachineID}
	if st.GetWithdrawn() {
		s.log.InfoContext(ctx, "offline grant withdrawal confirmed", attrs...)
	}
	if !st.GetBootedOffline() {
		return
	}
	s.cfg.Metrics.OfflineGrant(metrics.OfflineBooted)
	s.log.WarnContext(ctx, "node booted offline", append(attrs, logkey.OfflineBoot, st.GetBoot(), logkey.OfflineMaxBoots, st.GetMaxBoots(),
		logkey.Purpose, purposeLabel(hello))...)
	if out.bound && (err != nil || hello.GetPurpose() != latchkeyv1.Purpose_PURPOSE_REATTEST) {
		s.recordOfflineBoot(ctx, out)
	}
}

// recordOfflineBoot writes the offline boot on the node's Lease
// (Kubernetes mode) for the taint controller; a failure is logged, as
// the node's next re-attestation is what matters.
func (s *Service) recordOfflineBoot(ctx context.Context, out *outcome) {
	rec, ok := s.cfg.Bindings.(binding.OfflineRecorder)
	if !ok || s.cfg.Minter == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RevokeTimeout)
	defer cancel()
	if err := rec.RecordOfflineBoot(rctx, out.hello.GetNodeName(), out.verified.MachineID, s.cfg.Now()); err != nil {
		s.log.ErrorContext(ctx, "record offline boot on the node binding failed; the node is not tainted offline",
			logkey.Node, out.hello.GetNodeName(), logkey.Error, err.Error())
	}
}

// pcrList is "0,1,2" for the audit line.
func pcrList(pcrs map[uint32][]byte) string {
	idx := slices.Sorted(maps.Keys(pcrs))
	parts := make([]string, len(idx))
	for i, p := range idx {
		parts[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(parts, ",")
}
