package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Binding-store requests (the etcd store of disk-only replicas): latency
// and errors by operation. The op label is one of the store's own
// operation names (get, claim, update, release, list, import, check),
// never a peer's input.

// storeBuckets span a local etcd's commit (~1 ms) to a request that runs
// into its timeout while etcd elects a leader (seconds).
var storeBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

type storeMetrics struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

func newStoreMetrics(reg *prometheus.Registry) *storeMetrics {
	s := &storeMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "store_request_duration_seconds",
			Help:    "Binding-store (etcd) request latency by operation, failed requests included.",
			Buckets: storeBuckets,
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "store_errors_total",
			Help: "Binding-store (etcd) requests that failed (no quorum, unreachable, timed out, refused), by operation.",
		}, []string{"op"}),
	}
	reg.MustRegister(s.duration, s.errors)
	return s
}

// StoreRequest records one store request.
func (m *Metrics) StoreRequest(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.store.duration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.store.errors.WithLabelValues(op).Inc()
	}
}
