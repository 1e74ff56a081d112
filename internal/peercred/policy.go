package peercred

import (
	"context"
	"fmt"
	"log/slog"
	"os/user"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// Policy says who may call a local API. Root (uid 0) always may; so may a
// process whose primary or supplementary group is one of Groups. The zero
// Policy admits root only.
type Policy struct {
	Groups []uint32
}

// Allow returns nil when c may call, and a PermissionDenied status naming
// who was refused otherwise.
func (p Policy) Allow(c Creds) error {
	if c.UID == 0 {
		return nil
	}
	for _, g := range p.Groups {
		if c.InGroup(g) {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied,
		"caller uid %d gid %d is neither root nor in an allowed group", c.UID, c.GID)
}

func (p Policy) check(ctx context.Context) error {
	c, ok := FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer credentials on this connection")
	}
	return p.Allow(c)
}

// UnaryServerInterceptor refuses unary calls from callers Allow refuses.
func (p Policy) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := p.check(ctx); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// StreamServerInterceptor refuses streams from callers Allow refuses.
func (p Policy) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := p.check(ss.Context()); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

// ServerOptions returns what a gRPC server on a Unix socket needs to know
// and check its callers: transport credentials that refuse a caller p
// does not allow in the handshake, before any request byte is read
// (logging each refused uid once to log), and both interceptors as a
// second check (chained, so callers may add their own after them).
func ServerOptions(p Policy, log *slog.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(NewServerCredentials(p, log)),
		grpc.ChainUnaryInterceptor(p.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(p.StreamServerInterceptor()),
	}
}

// ClientCredentials are the transport credentials a local client dials
// with (grpc.WithTransportCredentials).
func ClientCredentials() credentials.TransportCredentials { return NewTransportCredentials() }

// LookupGroup resolves a group name from a config file ("latchkey") or a
// numeric gid to a gid.
func LookupGroup(name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("peercred: group %q: %w", name, err)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("peercred: group %q has gid %q: %w", name, g.Gid, err)
	}
	return uint32(n), nil
}
