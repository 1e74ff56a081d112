package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func newShadowDecisions() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "shadow_decisions_total",
		Help: "Decisions of the candidate policy (policyNext) on joins and re-attestations the enforced policy verified, by variant, decision (accepted, refused, unknown) and refusal reason (none when accepted). Nothing is enforced.",
	}, []string{"variant", "decision", "reason"})
}

// ShadowDecision counts one decision of the candidate policy.
func (m *Metrics) ShadowDecision(variant latchkeyv1.Variant, decision, reason string) {
	if m == nil {
		return
	}
	m.shadow.WithLabelValues(variantLabel(variant), decision, lower(reason)).Inc()
}
