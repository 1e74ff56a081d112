package service

import (
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Shadow decisions, as the audit line (shadow_decision) and the metric
// name them.
const (
	ShadowAccepted = "accepted"
	ShadowRefused  = "refused"
	// ShadowUnknown: the candidate policy has no section for the variant.
	ShadowUnknown = "unknown"
)

// evalShadow runs the candidate policy (Config.PolicyNext, `policyNext`)
// on the state the enforced policy's verification produced, and records
// its decision on the outcome (audit line) and in the metrics. It changes
// nothing about the join: the shadow only reports.
//
// What the shadow judges is the policy step (PCRs, components, SNP
// measurement, guest policy and TCB): the candidate validator's
// CheckPolicy on the state the enforced validator's Verify returned. Key trust (EK CA roots, AK pins, SNP roots) is
// the enforced policy's; a candidate that changes only key trust shows
// no difference here.
func (s *Service) evalShadow(variant latchkeyv1.Variant, v *attest.Verified, out *outcome) {
	if s.cfg.PolicyNext == nil || v == nil {
		return
	}
	next := s.cfg.PolicyNext.Current()
	out.shadowPolicy = next.Digest
	out.shadowDecision, out.shadowReason = ShadowUnknown, "NONE"
	if val, ok := next.Validators[variant]; ok {
		out.shadowDecision = ShadowAccepted
		if err := val.CheckPolicy(v.State); err != nil {
			out.shadowDecision, out.shadowReason = ShadowRefused, attest.ReasonOf(err).String()
		}
	}
	s.cfg.Metrics.ShadowDecision(variant, out.shadowDecision, out.shadowReason)
}

// shadowAttrs are the audit line's shadow fields (none without a
// candidate policy).
func shadowAttrs(out *outcome) []any {
	if out.shadowDecision == "" {
		return nil
	}
	return []any{logkey.ShadowDecision, out.shadowDecision, logkey.ShadowReason, out.shadowReason, logkey.ShadowPolicy, out.shadowPolicy}
}
