// Package localapi serves the latchkey programs' admin API (proto
// latchkey.admin.v1) on a Unix socket and dials it from the CLI. Callers
// are authenticated by their kernel peer credentials (internal/peercred):
// root, or a member of a configured group. Every call is logged with the
// caller's uid and pid.
//
// The server knows nothing of the agent's boot or the verifier's tokens: it
// takes small interfaces (AgentState, Tokens, PolicyChecker) that the
// programs implement, so this package stays free of their dependencies.
package localapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/internal/peercred"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
)

// The default socket paths. Each unit's RuntimeDirectory= creates the
// directory (latchkey/agent, latchkey/verifier) and removes it on stop.
const (
	AgentSocket    = "/run/latchkey/agent/admin.sock"
	VerifierSocket = "/run/latchkey/verifier/admin.sock"
)

// MaxPolicySize bounds the policy a CheckPolicy call may carry.
const MaxPolicySize = 1 << 20

// AgentState is the agent's live boot state. Status must be cheap, safe
// for concurrent use, and return a message the caller may not modify
// afterwards (a fresh copy).
type AgentState interface {
	Status() *adminv1.AgentStatus
}

// Tokens lists and revokes the bootstrap tokens a verifier minted.
type Tokens interface {
	List(ctx context.Context) ([]*adminv1.Token, error)
	// Revoke deletes the token; it returns an error wrapping
	// ErrTokenNotFound when no such token exists.
	Revoke(ctx context.Context, id string) error
}

// ErrTokenNotFound is what Tokens.Revoke wraps for an unknown token ID; the
// API answers NOT_FOUND.
var ErrTokenNotFound = errors.New("token not found")

// Bindings lists and releases the verifier's binding records. by, given
// to Release, names the caller for the store's audit line.
type Bindings interface {
	List(ctx context.Context) ([]*adminv1.Binding, error)
	// Release returns what the record held; an error wrapping
	// ErrBindingNotFound when the name is not bound, ErrBadBinding when
	// the name is not one.
	Release(ctx context.Context, kind adminv1.BindingKind, name, by string) (*adminv1.Binding, error)
}

// Errors Bindings.Release wraps; the API answers NOT_FOUND and
// INVALID_ARGUMENT.
var (
	ErrBindingNotFound = errors.New("binding not found")
	ErrBadBinding      = errors.New("not a node name or disk uuid")
)

// PolicyChecker validates a policy file's contents without loading it. It
// returns the digest the policy would have once loaded, or why it is
// invalid.
type PolicyChecker interface {
	Check(ctx context.Context, policy []byte) (digest string, err error)
}

// Config configures a Server. At least one of Agent, Tokens or Policies
// must be set: the agent sets Agent, the verifier sets Policies and, unless
// it runs in disk-only mode, Tokens.
type Config struct {
	// Access says who may call; the zero value admits root only.
	Access   peercred.Policy
	Agent    AgentState
	Tokens   Tokens
	Policies PolicyChecker
	Bindings Bindings
	Logger   *slog.Logger
}

// Server is a running admin API.
type Server struct {
	grpc *grpc.Server
	log  *slog.Logger
}

// NewServer builds the gRPC server; Serve starts it.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Agent == nil && cfg.Tokens == nil && cfg.Policies == nil && cfg.Bindings == nil {
		return nil, errors.New("localapi: nothing to serve: set Agent, Tokens or Policies")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "localapi")
	opts := append(peercred.ServerOptions(cfg.Access),
		grpc.ChainUnaryInterceptor(logCalls(log)),
		grpc.MaxRecvMsgSize(MaxPolicySize+4096),
	)
	s := &Server{grpc: grpc.NewServer(opts...), log: log}
	if cfg.Agent != nil {
		adminv1.RegisterAgentAdminServer(s.grpc, agentServer{state: cfg.Agent})
	}
	if cfg.Tokens != nil || cfg.Policies != nil || cfg.Bindings != nil {
		adminv1.RegisterVerifierAdminServer(s.grpc, &verifierServer{tokens: cfg.Tokens, policies: cfg.Policies,
			bindings: cfg.Bindings, log: log})
	}
	return s, nil
}

// Serve serves on l until Stop; it returns nil after Stop.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
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
		log.Log(ctx, level, "admin call", "method", info.FullMethod,
			"uid", c.UID, "gid", c.GID, "pid", c.PID,
			"code", status.Code(err).String(), "duration", time.Since(start))
		return resp, err
	}
}

type agentServer struct {
	adminv1.UnimplementedAgentAdminServer
	state AgentState
}

func (a agentServer) Status(context.Context, *adminv1.StatusRequest) (*adminv1.AgentStatus, error) {
	st := a.state.Status()
	if st == nil {
		return nil, status.Error(codes.Unavailable, "agent state not available yet")
	}
	return st, nil
}
