// Package localapi serves a latchkey program's admin API on a Unix socket
// and dials it from the CLI. Callers are authenticated by their kernel peer
// credentials (internal/peercred): root, or a member of a configured group,
// checked in the transport handshake, so a refused caller's connection is
// closed before any of its bytes is read (each refused uid is logged
// once). Connections (MaxConnections) and calls per connection
// (MaxStreamsPerConnection) are capped. Every call is logged with the
// caller's uid and pid.
//
// The package knows no service: each program registers its own
// (agent/adminapi, verifier/adminapi), so internal/ depends on nothing of
// the product's.
package localapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/internal/peercred"
)

// The default socket paths. Each unit's RuntimeDirectory= creates the
// directory (latchkey/agent, latchkey/verifier) and removes it on stop.
const (
	AgentSocket    = "/run/latchkey/agent/admin.sock"
	VerifierSocket = "/run/latchkey/verifier/admin.sock"
)

// MaxRequestSize bounds every request a Server accepts: 1 MiB of payload
// (verifier/adminapi's MaxPolicySize) and room for its framing.
const MaxRequestSize = 1<<20 + 4096

// Service registers one admin service on s; log is the server's logger.
type Service func(s *grpc.Server, log *slog.Logger)

// Config configures a Server.
type Config struct {
	// Access says who may call; the zero value admits root only.
	Access peercred.Policy
	// Services are the program's admin services; at least one.
	Services []Service
	Logger   *slog.Logger
}

// Bounds on what admitted callers can make a Server hold. Callers the
// access policy refuses hold nothing: their connection is closed in the
// transport handshake, before a byte of it is read.
const (
	// MaxConnections bounds the open connections; one past it is closed
	// at once (a CLI opens one per command).
	MaxConnections = 16
	// MaxStreamsPerConnection bounds the concurrent calls of one
	// connection (the HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS sent).
	MaxStreamsPerConnection = 8
)

// Server is a running admin API.
type Server struct {
	grpc *grpc.Server
	log  *slog.Logger
}

// NewServer builds the gRPC server; Serve starts it.
func NewServer(cfg Config) (*Server, error) {
	if len(cfg.Services) == 0 {
		return nil, errors.New("localapi: nothing to serve: no admin service")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With(logkey.Component, "localapi")
	opts := append(peercred.ServerOptions(cfg.Access, log),
		grpc.ChainUnaryInterceptor(logCalls(log)),
		grpc.MaxRecvMsgSize(MaxRequestSize),
		grpc.MaxConcurrentStreams(MaxStreamsPerConnection),
	)
	s := &Server{grpc: grpc.NewServer(opts...), log: log}
	for _, register := range cfg.Services {
		register(s.grpc, log)
	}
	return s, nil
}

// Serve serves on l, at most MaxConnections at once, until Stop; it
// returns nil after Stop.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(peercred.LimitListener(l, MaxConnections, s.log)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("localapi: serve: %w", err)
	}
	return nil
}

// Stop lets running calls finish until ctx ends, then closes every
// connection.
func (s *Server) Stop(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// logCalls writes one line per call: method, caller, outcome, duration.
func logCalls(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		c, _ := peercred.FromContext(ctx)
		level := slog.LevelInfo
		if err != nil {
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "admin call", logkey.Method, info.FullMethod,
			logkey.UID, c.UID, logkey.GID, c.GID, logkey.PID, c.PID,
			logkey.Code, status.Code(err).String(), logkey.Duration, time.Since(start))
		return resp, err
	}
}
