package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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

// ListenAndServe serves /metrics on addr until ctx ends. An empty addr
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

// Serve serves /metrics on l until ctx ends, then shuts down, giving
// running scrapes a few seconds.
func (m *Metrics) Serve(ctx context.Context, l net.Listener, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler(log))
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
