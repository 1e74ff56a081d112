package service

import (
	"crypto/tls"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Bounds on what one unauthenticated connection can make the verifier
// hold (documented in docs/configuration.md, "Limits").
const (
	// MaxHeaderListSize bounds a stream's request metadata (8 KiB).
	MaxHeaderListSize = 8 << 10
	// MaxStreamsPerConnection bounds concurrent streams per connection.
	MaxStreamsPerConnection = 4
)

// NewGRPCServer serves svc and the standard health service on attested
// TLS 1.3, with the receive limit every join message must fit. The health
// server is returned so the caller can flip it to NOT_SERVING on shutdown.
func NewGRPCServer(svc *Service, cert tls.Certificate) (*grpc.Server, *health.Server) {
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(serverTLS(cert))),
		// codec.go: a message grpc cannot read is refused by the handler,
		// as MALFORMED with a Refusal, not by grpc without one.
		grpc.MaxRecvMsgSize(grpcRecvLimit),
		grpc.ForceServerCodecV2(newJoinCodec()),
		// A join sends a few small headers; grpc-go's default (16 MiB per
		// stream) let 50 streams hold 400 MB for a whole join timeout.
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		// One join is one stream; a few more leave room for health checks.
		grpc.MaxConcurrentStreams(MaxStreamsPerConnection),
		// The TLS handshake must finish in this time.
		grpc.ConnectionTimeout(10*time.Second),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: 30 * time.Second,
			// No join lives longer than its timeout; a connection that
			// does is closed (after a grace for the stream in flight).
			MaxConnectionAge:      2 * time.Minute,
			MaxConnectionAgeGrace: 10 * time.Second,
		}),
		// Join messages are small and every join is a new connection: small
		// per-connection buffers cut the allocation per join by about an
		// eighth (load benchmark), without changing CPU.
		grpc.ReadBufferSize(16<<10),
		grpc.WriteBufferSize(16<<10),
		grpc.SharedWriteBuffer(true),
		// A join's handler verifies a P-384 signature and decodes protobuf
		// several frames deep: on a fresh goroutine its stack grows from
		// 8 KiB by copying, every join. A pool as large as the default
		// admission limit keeps grown stacks between joins (grpc-go starts
		// a goroutine when every worker is busy, so this bounds nothing).
		grpc.NumStreamWorkers(uint32(DefaultMaxInFlight())),
		// Fixed flow-control windows that fit the largest join message:
		// grpc-go's dynamic windows send a bandwidth-probing PING on every
		// connection's first data and read its answer (a write, a read and
		// a wake-up per join, for windows a join never needs), and could
		// grow a connection's window to 16 MiB of unread data.
		grpc.StaticStreamWindowSize(grpcRecvLimit),
		grpc.StaticConnWindowSize(grpcRecvLimit),
	)
	latchkeyv1.RegisterJoinServiceServer(srv, svc)
	hs := health.NewServer()
	hs.SetServingStatus(latchkeyv1.JoinService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	return srv, hs
}

// serverTLS is attested TLS's server configuration without session
// tickets, so no session is ever resumed. The attestation binding would
// survive a resumption (the exporter comes from each connection's own
// handshake), but nothing else argues for one: an agent joins once per
// boot, from a new process, so it has no session to resume unless it
// stored a ticket on the disk that is still locked, and whoever read that
// ticket's secret there could answer for the verifier on that agent's
// next resumption without the pinned key. Issuing tickets no agent uses
// would only cost CPU (the Go agent offers no resumption, so none is
// issued to it today) and add a ticket key to the process.
func serverTLS(cert tls.Certificate) *tls.Config {
	cfg := atls.ServerConfig(cert)
	cfg.SessionTicketsDisabled = true
	return cfg
}
