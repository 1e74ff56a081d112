// Package metrics exposes the verifier's Prometheus metrics: joins by
// variant, result and reason, validation latency, tokens minted and
// revoked, policy reloads and the digest of the policy in force.
//
// A nil *Metrics is valid and records nothing, so code paths need no
// "metrics enabled?" checks; the HTTP endpoint is off unless an address is
// configured. Label values come only from closed sets (enum names, fixed
// words): a peer cannot create new time series by sending odd values.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

const namespace = "latchkey_verifier"

// Join results.
const (
	ResultAccepted = "accepted"
	// ResultRefused: the evidence or request failed a check.
	ResultRefused = "refused"
	// ResultFailed: the verifier could not decide (INTERNAL, UNAVAILABLE).
	ResultFailed = "failed"
)

// RevokeCause says why a bootstrap token was revoked.
type RevokeCause string

// Revoke causes.
const (
	// RevokeNoAck: the ticket never reached the agent (no TicketAck).
	RevokeNoAck RevokeCause = "no_ack"
	// RevokeAdmin: an operator ran `latchkey-verifier tokens revoke`.
	RevokeAdmin RevokeCause = "admin"
	// RevokeUsed: the node used the token (certificate issued, Node
	// registered), so it was deleted before its TTL.
	RevokeUsed RevokeCause = "used"
	// RevokeDenied: the node is on the policy's deny list.
	RevokeDenied RevokeCause = "denied"
)

// validationBuckets span a TPM quote check (~0.15 ms) to an SNP check that
// fetches collateral over the network (seconds).
var validationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
	0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Metrics holds the verifier's collectors in a registry of its own.
type Metrics struct {
	reg        *prometheus.Registry
	joins      *prometheus.CounterVec
	validation *prometheus.HistogramVec
	minted     prometheus.Counter
	revoked    *prometheus.CounterVec
	reloads    *prometheus.CounterVec
	policy     *prometheus.GaugeVec
	secret     *prometheus.GaugeVec
	connsOver  *prometheus.CounterVec
	adm        *admissionMetrics
	// reattest holds the re-attestation gauges (reattest.go).
	reattest *prometheus.GaugeVec
	// shadow counts the candidate policy's decisions (shadow.go).
	shadow *prometheus.CounterVec
	// offline counts offline grant events (offline.go).
	offline *prometheus.CounterVec
	// gens are the master-secret generation gauges (generations.go).
	gens *generationMetrics
	// store is the binding store's request metrics (store.go).
	store *storeMetrics
	// ops are build, certificate, reload and handshake metrics (ops.go).
	ops *opsMetrics
	// ready is the /readyz check (server.go).
	ready readyCheck
}

// New creates the metrics, with the Go runtime and process collectors
// (resident memory, open files, CPU) alongside.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "joins_total",
			Help: "Join attempts by evidence variant, result (accepted, refused, failed) and refusal reason (none when accepted).",
		}, []string{"variant", "result", "reason"}),
		validation: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "validation_duration_seconds",
			Help:    "Time to validate one piece of evidence, challenge round trips included.",
			Buckets: validationBuckets,
		}, []string{"variant"}),
		minted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "tokens_minted_total",
			Help: "Bootstrap tokens minted.",
		}),
		revoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "tokens_revoked_total",
			Help: "Bootstrap tokens revoked, by cause (no_ack, admin, used: deleted once the node had its certificate and registered, denied: the node is on the policy's deny list).",
		}, []string{"cause"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "policy_reloads_total",
			Help: "Policy loads and reloads by result (ok, error); a failed reload keeps the previous policy, and a bad file counts once per distinct content.",
		}, []string{"result"}),
		policy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "policy_info",
			Help: "Always 1; the digest label is the sha256 of the policy in force.",
		}, []string{"digest"}),
		secret: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "master_secret_info",
			Help: "Always 1 per master-secret generation served; the key_id label names that generation's secret and the cluster salt (replicas that agree derive the same disk keys). The current generation is master_secret_current_generation.",
		}, []string{"generation", "key_id"}),
		connsOver: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "connections_refused_total",
			Help: "Join-port connections closed at accept because a limit was reached, by limit (total, per_source).",
		}, []string{"limit"}),
	}
	m.reattest = newReattestNodes()
	m.shadow = newShadowDecisions()
	m.offline = newOfflineGrants()
	m.reg.MustRegister(m.reattest, m.shadow, m.offline)
	m.reg.MustRegister(m.joins, m.validation, m.minted, m.revoked, m.reloads, m.policy, m.secret, m.connsOver,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.adm = newAdmissionMetrics(m.reg)
	m.gens = newGenerationMetrics(m.reg)
	m.store = newStoreMetrics(m.reg)
	m.ops = newOpsMetrics(m.reg)
	m.initSeries()
	return m
}

// initSeries creates the series every dashboard queries, at zero, so a
// rate() over a fresh verifier is 0 and not "no data".
func (m *Metrics) initSeries() {
	for _, v := range []latchkeyv1.Variant{latchkeyv1.Variant_VARIANT_TPM, latchkeyv1.Variant_VARIANT_SNP} {
		m.joins.WithLabelValues(variantLabel(v), ResultAccepted, "none")
	}
	m.revoked.WithLabelValues(string(RevokeNoAck))
	m.revoked.WithLabelValues(string(RevokeAdmin))
	m.revoked.WithLabelValues(string(RevokeUsed))
	m.revoked.WithLabelValues(string(RevokeDenied))
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.connsOver.WithLabelValues("total")
	m.connsOver.WithLabelValues("per_source")
}

// Registry is where the collectors live, for tests and for adding
// collectors of the caller's own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Join counts one finished join attempt; err is nil for an accepted join
// and otherwise the error the attempt ended with (an *attest.Refusal or
// any error, which counts as INTERNAL).
func (m *Metrics) Join(variant latchkeyv1.Variant, err error) {
	if m == nil {
		return
	}
	result, reason := ResultAccepted, "none"
	if err != nil {
		r := attest.ReasonOf(err)
		reason = reasonLabel(r)
		result = ResultRefused
		if r == latchkeyv1.Reason_INTERNAL || r == latchkeyv1.Reason_UNAVAILABLE {
			result = ResultFailed
		}
	}
	m.joins.WithLabelValues(variantLabel(variant), result, reason).Inc()
}

// ObserveValidation records how long one validation took.
func (m *Metrics) ObserveValidation(variant latchkeyv1.Variant, d time.Duration) {
	if m == nil {
		return
	}
	m.validation.WithLabelValues(variantLabel(variant)).Observe(d.Seconds())
}

// TokenMinted counts one minted bootstrap token.
func (m *Metrics) TokenMinted() {
	if m == nil {
		return
	}
	m.minted.Inc()
}

// TokenRevoked counts one revoked bootstrap token.
func (m *Metrics) TokenRevoked(cause RevokeCause) {
	if m == nil {
		return
	}
	switch cause {
	case RevokeNoAck, RevokeAdmin, RevokeUsed, RevokeDenied:
	default:
		cause = "other"
	}
	m.revoked.WithLabelValues(string(cause)).Inc()
}

// PolicyLoaded records a successful (re)load and the digest now in force
// ("sha256:<hex>").
func (m *Metrics) PolicyLoaded(digest string) {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues("ok").Inc()
	m.ops.reloadSucceeded()
	m.policy.Reset()
	m.policy.WithLabelValues(digest).Set(1)
}

// ConnectionRefused counts a join-port connection closed over a limit.
func (m *Metrics) ConnectionRefused(perSource bool) {
	if m == nil {
		return
	}
	limit := "total"
	if perSource {
		limit = "per_source"
	}
	m.connsOver.WithLabelValues(limit).Inc()
}

// PolicyReloadFailed records a reload that failed; the previous policy
// (and its digest) stays in force.
func (m *Metrics) PolicyReloadFailed() {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues("error").Inc()
	m.ops.failing.Set(1)
}

// variantLabel is "tpm", "snp", ... for known variants and "unknown" for
// any other number a peer may send.
func variantLabel(v latchkeyv1.Variant) string {
	name, ok := latchkeyv1.Variant_name[int32(v)]
	if !ok || v == latchkeyv1.Variant_VARIANT_UNSPECIFIED {
		return "unknown"
	}
	return lower(name[len("VARIANT_"):])
}

func reasonLabel(r latchkeyv1.Reason) string {
	if name, ok := latchkeyv1.Reason_name[int32(r)]; ok {
		return name
	}
	return "unknown"
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
