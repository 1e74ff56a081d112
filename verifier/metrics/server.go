package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves the registry in the Prometheus exposition formats. A
// collector error drops that one metric instead of failing the scrape
// (e.g. /proc/stat is hidden by the unit's ProcSubset=pid).
func (m *Metrics) Handler(log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:            slogPrintln{log},
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

type slogPrintln struct{ log *slog.Logger }

func (s slogPrintln) Println(v ...any) { s.log.Warn("metrics", logkey.Error, fmt.Sprint(v...)) }

// ListenAndServe serves /metrics, /healthz and /readyz on addr until ctx
// ends. An empty addr
// means metrics are off: it returns nil at once.
func (m *Metrics) ListenAndServe(ctx context.Context, addr string, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return m.Serve(ctx, l, log)
}

// Serve serves /metrics, /healthz and /readyz on l until ctx ends, then shuts down, giving
// running scrapes a few seconds.
func (m *Metrics) Serve(ctx context.Context, l net.Listener, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler(log))
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", m.readyz)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		case <-done:
		}
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// readyCheck holds the /readyz check the verifier sets once assembled.
type readyCheck struct {
	check atomic.Pointer[func(context.Context) error]
}

// readyTimeout bounds one readiness check (a store round trip).
const readyTimeout = 3 * time.Second

// SetReadyCheck sets what /readyz asks: nil error means ready. Until it
// is set /readyz answers 503.
func (m *Metrics) SetReadyCheck(check func(context.Context) error) {
	if m == nil {
		return
	}
	m.ready.check.Store(&check)
}

// healthz answers 200 while the process serves HTTP at all: a liveness
// probe that restarts a verifier only when it is wedged, never because a
// dependency is down.
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// readyz answers 200 when the verifier can decide joins (policy and
// master secret loaded, binding store reachable) and 503 with the first
// reason otherwise, so a load balancer sends joins elsewhere. The reason
// names a component, never a secret.
func (m *Metrics) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	check := m.ready.check.Load()
	if check == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: starting\n"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := (*check)(ctx); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}
