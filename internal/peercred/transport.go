package peercred

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
)

// protocol is the SecurityProtocol peercred connections report.
const protocol = "peercred"

type transport struct{}

// NewTransportCredentials returns gRPC transport credentials for Unix
// sockets. On the server every connection carries its peer's Creds
// (FromContext); a connection that is not a Unix socket fails the
// handshake. The client side records the server's Creds the same way
// (peer.FromContext on the client) and trusts the socket's path: the
// admin sockets live in root-owned directories under /run/latchkey.
//
// The kernel already keeps a Unix socket's traffic private and intact, so
// the credentials report PrivacyAndIntegrity and wrap nothing.
func NewTransportCredentials() credentials.TransportCredentials { return transport{} }

func (transport) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return handshake(conn)
}

func (transport) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return handshake(conn)
}

func handshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, err := Read(conn)
	if err != nil {
		return nil, nil, err
	}
	return conn, AuthInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		Creds:          c,
	}, nil
}

func (transport) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: protocol}
}

func (t transport) Clone() credentials.TransportCredentials { return t }

// OverrideServerName is a no-op: a Unix socket has no server name.
func (transport) OverrideServerName(string) error { return nil }
