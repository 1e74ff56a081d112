package metrics

import "github.com/prometheus/client_golang/prometheus"

// Offline grant events (latchkey_verifier_offline_grants_total).
const (
	// OfflineGranted: a ticket carried an offline grant.
	OfflineGranted = "granted"
	// OfflineWithdrawn: a ticket or refusal withdrew the grant a node
	// said it held.
	OfflineWithdrawn = "withdrawn"
	// OfflineBooted: an attested node reported that it unlocked its disk
	// offline.
	OfflineBooted = "booted_offline"
)

func newOfflineGrants() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "offline_grants_total",
		Help: "Offline unlock events: granted (a ticket carried a grant), withdrawn (a ticket or refusal withdrew the grant a node held), booted_offline (an attested node reported an offline unlock).",
	}, []string{"event"})
	for _, e := range []string{OfflineGranted, OfflineWithdrawn, OfflineBooted} {
		c.WithLabelValues(e)
	}
	return c
}

// OfflineGrant counts one offline grant event (OfflineGranted, …).
func (m *Metrics) OfflineGrant(event string) {
	if m == nil {
		return
	}
	m.offline.WithLabelValues(event).Inc()
}
