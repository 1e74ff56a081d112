package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/latchkey/latchkey/verifier/keys"
)

// Master-secret generations (docs/operations.md, "Rotating the master
// secret"): which generations this replica serves, which is current, and
// how many disks the binding records show on each, so an operator sees
// when an old generation can be retired. Label values are generation
// numbers of the verifier's own configuration and of its own records,
// never a peer's input.

// generationMetrics are registered by New.
type generationMetrics struct {
	current prometheus.Gauge
	disks   *prometheus.GaugeVec
}

func newGenerationMetrics(reg *prometheus.Registry) *generationMetrics {
	g := &generationMetrics{
		current: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "master_secret_current_generation",
			Help: "The master-secret generation new disk keys are derived from.",
		}),
		disks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "disks_by_key_generation",
			Help: "Disk binding records by the master-secret generation their disk's last join named (unknown: a record from before generations were recorded).",
		}, []string{"generation"}),
	}
	reg.MustRegister(g.current, g.disks)
	return g
}

// MasterSecretsLoaded records every served generation's key ID (not
// secret) and the current generation.
func (m *Metrics) MasterSecretsLoaded(gens []keys.GenerationInfo) {
	if m == nil {
		return
	}
	m.secret.Reset()
	for _, g := range gens {
		n := strconv.FormatUint(uint64(g.Generation), 10)
		m.secret.WithLabelValues(n, g.KeyID).Set(1)
		if g.Current {
			m.gens.current.Set(float64(g.Generation))
		}
	}
}

// GenerationUnknown is the label of disks with no recorded generation.
const GenerationUnknown = "unknown"

// DisksByKeyGeneration replaces the per-generation disk counts (keys are
// generation numbers as text, or GenerationUnknown).
func (m *Metrics) DisksByKeyGeneration(counts map[string]int) {
	if m == nil {
		return
	}
	m.gens.disks.Reset()
	for gen, n := range counts {
		m.gens.disks.WithLabelValues(gen).Set(float64(n))
	}
}
