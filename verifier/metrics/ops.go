package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/latchkey/latchkey/internal/version"
)

// Causes of a TLS handshake on the join port that did not finish (the
// tls_handshake_failures_total label). TLS 1.3 encrypts the client's
// alert, so the verifier cannot read why a client gave up; it sees where
// the handshake stopped. An agent whose pin matches no certificate we
// serve (a rotation gone wrong) sends an alert right after our
// certificate: client_alert.
const (
	// HandshakeClientAlert: the client answered our certificate with an
	// alert instead of its Finished and hung up (pin or CA rejected).
	HandshakeClientAlert = "client_alert"
	// HandshakeClientClosed: the client hung up after our certificate
	// without a word.
	HandshakeClientClosed = "client_closed"
	// HandshakeServerRefused: the verifier refused the ClientHello (no
	// TLS 1.3, no common cipher suite or ALPN protocol, malformed).
	HandshakeServerRefused = "server_refused"
	// HandshakeNotTLS: the first bytes were not a TLS handshake (plain
	// HTTP, a port scanner).
	HandshakeNotTLS = "not_tls"
	// HandshakeIncomplete: the connection closed before a whole
	// ClientHello arrived (a TCP health check).
	HandshakeIncomplete = "incomplete_hello"
	// HandshakeTimeout: the handshake did not finish within the
	// connection timeout.
	HandshakeTimeout = "timeout"
)

// HandshakeCauses is every cause, in the order of the docs.
var HandshakeCauses = []string{HandshakeClientAlert, HandshakeClientClosed, HandshakeServerRefused,
	HandshakeNotTLS, HandshakeIncomplete, HandshakeTimeout}

// opsMetrics are what an operator alerts on besides joins: which build
// runs, when the serving certificate expires, when the policy last
// loaded, handshakes that failed.
type opsMetrics struct {
	buildInfo   *prometheus.GaugeVec
	certExpiry  prometheus.Gauge
	lastReload  prometheus.Gauge
	failing     prometheus.Gauge
	handshakes  *prometheus.CounterVec
	nowForTests func() time.Time
}

func newOpsMetrics(reg *prometheus.Registry) *opsMetrics {
	o := &opsMetrics{
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "build_info",
			Help: "Always 1; the labels name the running build: version (release, stamped module version or devel), revision (commit, or unknown) and goversion.",
		}, []string{"version", "revision", "goversion"}),
		certExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "serving_certificate_expiry_timestamp_seconds",
			Help: "When the join port's serving certificate (the leaf) expires, in seconds since the Unix epoch.",
		}),
		lastReload: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "policy_last_reload_success_timestamp_seconds",
			Help: "When the policy file was last loaded successfully (at start or by a reload of changed content), in seconds since the Unix epoch.",
		}),
		failing: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "policy_reload_failing",
			Help: "1 while the policy file on disk is refused and the previous policy stays in force, else 0.",
		}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "tls_handshake_failures_total",
			Help: "TLS handshakes on the join port that did not finish, by cause (client_alert: the client rejected our certificate, as an agent whose pin does not match does; client_closed, server_refused, not_tls, incomplete_hello, timeout).",
		}, []string{"cause"}),
		nowForTests: time.Now,
	}
	reg.MustRegister(o.buildInfo, o.certExpiry, o.lastReload, o.failing, o.handshakes)
	b := version.Get()
	o.buildInfo.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	for _, c := range HandshakeCauses {
		o.handshakes.WithLabelValues(c)
	}
	return o
}

// ServingCertificateExpires records the serving certificate's NotAfter.
func (m *Metrics) ServingCertificateExpires(notAfter time.Time) {
	if m == nil {
		return
	}
	m.ops.certExpiry.Set(float64(notAfter.Unix()))
}

// HandshakeFailed counts a TLS handshake that did not finish; cause is
// one of HandshakeCauses (anything else counts as server_refused, so no
// caller can mint a label).
func (m *Metrics) HandshakeFailed(cause string) {
	if m == nil {
		return
	}
	switch cause {
	case HandshakeClientAlert, HandshakeClientClosed, HandshakeServerRefused,
		HandshakeNotTLS, HandshakeIncomplete, HandshakeTimeout:
	default:
		cause = HandshakeServerRefused
	}
	m.ops.handshakes.WithLabelValues(cause).Inc()
}

// reloadSucceeded stamps the time of a successful policy load.
func (o *opsMetrics) reloadSucceeded() {
	o.lastReload.Set(float64(o.nowForTests().UnixNano()) / 1e9)
	o.failing.Set(0)
}
