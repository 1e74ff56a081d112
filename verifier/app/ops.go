package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/tlswatch"
)

// What the metrics listener tells an operator besides /metrics: whether
// this verifier can decide joins (/readyz), which certificate it serves
// until when, and which handshakes never finished.

// bind binds every listener before anything serves: the metrics
// address, the join port and the admin socket. One that cannot be bound
// stops the verifier with a configuration error naming its setting
// (restarting cannot free an address another program holds), and the
// ones already bound are closed.
func (v *Verifier) bind() (metrics, join net.Listener, stopAdmin func(), err error) {
	if metrics, err = v.bindMetrics(); err != nil {
		return nil, nil, nil, err
	}
	if join, err = v.listener(); err == nil {
		if stopAdmin, err = v.serveAdmin(); err != nil {
			join.Close()
		}
	}
	if err != nil && metrics != nil {
		metrics.Close()
	}
	return metrics, join, stopAdmin, err
}

// bindMetrics binds the metrics address before anything serves, so an
// address in use stops the verifier with a configuration error naming
// the setting instead of a verifier that serves without its metrics and
// probes. Nil when metrics are off.
func (v *Verifier) bindMetrics() (net.Listener, error) {
	if v.cfg.MetricsListen == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", v.cfg.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("%w: metricsListen %s: %w", ErrConfig, v.cfg.MetricsListen, err)
	}
	return l, nil
}

// serveMetrics serves /metrics, /healthz and /readyz on l (nil: off).
func (v *Verifier) serveMetrics(ctx context.Context, l net.Listener) {
	if l == nil {
		return
	}
	if err := v.metrics.Serve(ctx, l, v.deps.Logger); err != nil {
		v.deps.Logger.Error("metrics server failed", logkey.Address, v.cfg.MetricsListen, logkey.Error, err.Error())
	}
}

// watchHandshakes counts (and logs, rate-limited) the TLS handshakes on
// the join port that never finish. l is the port after the connection
// limits, so connections closed at accept on purpose do not count.
func (v *Verifier) watchHandshakes(l net.Listener) net.Listener {
	return tlswatch.Wrap(l, tlswatch.Config{OnFailure: v.metrics.HandshakeFailed, Logger: v.deps.Logger})
}

// recordCertificate exports when the serving certificate expires.
func (v *Verifier) recordCertificate(cert tls.Certificate) error {
	leaf := cert.Leaf
	if leaf == nil && len(cert.Certificate) > 0 {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("serving certificate: %w", err)
		}
	}
	if leaf != nil {
		v.metrics.ServingCertificateExpires(leaf.NotAfter)
	}
	return nil
}

// readyProbe is a node name no Kubernetes node is likely to have: the
// readiness check reads its binding record to learn the store answers.
const readyProbe = "latchkey-readiness-probe"

// ready is /readyz: the join service serves, a policy and the master
// secret are loaded, and the binding store answers (a record or "no
// record" both prove it reachable).
func (v *Verifier) ready(ctx context.Context) error {
	if err := v.Healthy(ctx); err != nil {
		return err
	}
	if v.store == nil || v.store.Current() == nil {
		return errors.New("no policy loaded")
	}
	if v.keys == nil || len(v.keys.Generations()) == 0 {
		return errors.New("no master secret loaded")
	}
	if _, err := v.bindings.Get(ctx, binding.Node, readyProbe); err != nil && !errors.Is(err, binding.ErrNotFound) {
		return fmt.Errorf("binding store unreachable: %w", err)
	}
	return nil
}
