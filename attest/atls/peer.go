package atls

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// PeerBinding computes hello's binding to the TLS session of the gRPC
// stream whose context is ctx. Both ends use it: gRPC puts the peer, with
// the session's connection state, in the stream context on the server and
// on the client alike.
func PeerBinding(ctx context.Context, hello *latchkeyv1.Hello) ([]byte, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, errors.New("stream has no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, fmt.Errorf("stream is not on TLS (auth %T)", p.AuthInfo)
	}
	return SessionBinding(&info.State, hello)
}
