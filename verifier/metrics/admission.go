package metrics

import "github.com/prometheus/client_golang/prometheus"

// Causes of a stream that ended without a Hello (the
// streams_without_hello_total label): counted, not audited line by line,
// so a flood of empty streams costs no log volume.
const (
	NoHelloClosed    = "closed"    // half-closed or cancelled before a Hello
	NoHelloMalformed = "malformed" // the first message was not a Hello
	NoHelloTimeout   = "timeout"   // the join timeout passed first
	NoHelloOther     = "other"
)

// admissionMetrics are the collectors of admission control and of streams
// that never became joins.
type admissionMetrics struct {
	refused  prometheus.Counter
	inFlight prometheus.Gauge
	noHello  *prometheus.CounterVec
}

func newAdmissionMetrics(reg *prometheus.Registry) *admissionMetrics {
	a := &admissionMetrics{
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "admission_refused_total",
			Help: "Joins answered RESOURCE_EXHAUSTED with a retry-after hint because the in-flight limit was reached.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "joins_in_flight",
			Help: "Joins admitted past their Hello and not yet ended.",
		}),
		noHello: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "streams_without_hello_total",
			Help: "Join streams that ended before a Hello arrived, by cause (closed, malformed, timeout, other).",
		}, []string{"cause"}),
	}
	reg.MustRegister(a.refused, a.inFlight, a.noHello)
	for _, c := range []string{NoHelloClosed, NoHelloMalformed, NoHelloTimeout, NoHelloOther} {
		a.noHello.WithLabelValues(c)
	}
	return a
}

// AdmissionRefused counts a join refused at the in-flight limit.
func (m *Metrics) AdmissionRefused() {
	if m == nil {
		return
	}
	m.adm.refused.Inc()
}

// InFlight moves the in-flight gauge by delta (+1 admitted, -1 ended).
func (m *Metrics) InFlight(delta int) {
	if m == nil {
		return
	}
	m.adm.inFlight.Add(float64(delta))
}

// StreamWithoutHello counts a stream that ended before its Hello.
func (m *Metrics) StreamWithoutHello(cause string) {
	if m == nil {
		return
	}
	m.adm.noHello.WithLabelValues(cause).Inc()
}
