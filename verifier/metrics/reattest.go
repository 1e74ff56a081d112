package metrics

import "github.com/prometheus/client_golang/prometheus"

// Node states of the re-attestation controller (verifier/reattest).
const (
	ReattestAttested = "attested"
	ReattestStale    = "stale"
	ReattestRefused  = "refused"
	// ReattestOffline: the node unlocked offline and has not been
	// attested since.
	ReattestOffline = "offline"
)

func newReattestNodes() *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "reattest_nodes",
		Help: "Nodes by re-attestation state (attested; stale: Lease older than reattest.deadline; refused: the latest re-attestation was refused; offline: the node reported an offline unlock and no re-attestation has succeeded since), as of the leading replica's last pass; 0 on replicas that do not lead.",
	}, []string{"state"})
	for _, s := range []string{ReattestAttested, ReattestStale, ReattestRefused, ReattestOffline} {
		g.WithLabelValues(s)
	}
	return g
}

// ReattestNodes sets the node counts of the controller's last pass.
func (m *Metrics) ReattestNodes(attested, stale, refused, offline int) {
	if m == nil {
		return
	}
	m.reattest.WithLabelValues(ReattestAttested).Set(float64(attested))
	m.reattest.WithLabelValues(ReattestStale).Set(float64(stale))
	m.reattest.WithLabelValues(ReattestRefused).Set(float64(refused))
	m.reattest.WithLabelValues(ReattestOffline).Set(float64(offline))
}
