package ticket

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/internal/pkitest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// scriptedVerifier is a JoinService over TLS that records each Hello and
// answers with refusal (a gRPC status carrying a Refusal) or ticket.
type scriptedVerifier struct {
	latchkeyv1.UnimplementedJoinServiceServer
	code    codes.Code
	refusal *latchkeyv1.Refusal
	ticket  *latchkeyv1.Ticket
	mu      sync.Mutex
	hellos  []*latchkeyv1.Hello
}

func (v *scriptedVerifier) Join(stream latchkeyv1.JoinService_JoinServer) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.hellos = append(v.hellos, m.GetHello())
	v.mu.Unlock()
	if v.refusal != nil {
		st, _ := status.New(v.code, "refused").WithDetails(v.refusal)
		return st.Err()
	}
	if err := stream.Send(&latchkeyv1.VerifierMessage{Msg: &latchkeyv1.VerifierMessage_Ticket{Ticket: v.ticket}}); err != nil {
		return err
	}
	_, _ = stream.Recv() // the ack
	return nil
}

func (v *scriptedVerifier) serve(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(atls.ServerConfig(pkitest.SelfSigned(t, "verifier").TLSCertificate()))))
	latchkeyv1.RegisterJoinServiceServer(srv, v)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func windowClient(t *testing.T, ep string, waits *[]time.Duration, maxWaits int) *Client {
	t.Helper()
	c, err := New(Config{Endpoints: []string{ep}, InsecureSkipVerifierAuth: true, Issuer: &attesttest.Issuer{},
		Timeout: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sleep: func(ctx context.Context, d time.Duration) error {
			*waits = append(*waits, d)
			if len(*waits) >= maxWaits {
				return context.DeadlineExceeded
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var offlineHello = &latchkeyv1.OfflineState{Held: true, BootedOffline: true, Boot: 2, MaxBoots: 5}

// GetWithin ends at the first refusal a verifier decided, keeping its
// withdraw flag; Get keeps retrying it. The Hello carries the offline
// state.
func TestGetWithinEndsOnRefusal(t *testing.T) {
	v := &scriptedVerifier{code: codes.PermissionDenied,
		refusal: &latchkeyv1.Refusal{Reason: latchkeyv1.Reason_REVOKED, Detail: "deny-listed", WithdrawOffline: true}}
	ep := v.serve(t)
	var waits []time.Duration
	req := Request{NodeName: "n", DiskUUID: "u", Role: latchkeyv1.Role_ROLE_WORKER, Rejoin: true, Offline: offlineHello}
	_, err := windowClient(t, ep, &waits, 3).GetWithin(context.Background(), req, time.Hour)
	var r *RefusedError
	if !errors.As(err, &r) || r.Reason != latchkeyv1.Reason_REVOKED || !r.WithdrawOffline || len(waits) != 0 {
		t.Fatalf("GetWithin = %v after %d waits, want the withdrawing refusal at once", err, len(waits))
	}
	if len(v.hellos) != 1 || !proto.Equal(v.hellos[0].GetOffline(), offlineHello) {
		t.Fatalf("hellos %v: want one carrying the offline state", v.hellos)
	}
	waits = nil
	if _, err := windowClient(t, ep, &waits, 2).Get(context.Background(), req); len(waits) != 2 || !errors.As(err, &r) {
		t.Fatalf("Get = %v after %d waits: want the refusal retried", err, len(waits))
	}
}

// A verifier that is unavailable has not answered: the window ends as
// unreachable.
func TestGetWithinUnavailableIsNoAnswer(t *testing.T) {
	v := &scriptedVerifier{code: codes.Unavailable, refusal: &latchkeyv1.Refusal{Reason: latchkeyv1.Reason_UNAVAILABLE, Detail: "no quorum"}}
	var waits []time.Duration
	_, err := windowClient(t, v.serve(t), &waits, 2).GetWithin(context.Background(), Request{NodeName: "n", DiskUUID: "u"}, time.Minute)
	if !errors.Is(err, ErrUnreachable) || len(waits) != 2 || !strings.Contains(err.Error(), "after 1m0s") {
		t.Fatalf("GetWithin = %v after %d waits, want unreachable after the window", err, len(waits))
	}
}

// A re-attestation's ticket may carry the offline grant's renewal or
// withdrawal, and nothing else.
func TestReattestTicketMayCarryOfflineFields(t *testing.T) {
	g := &latchkeyv1.OfflineGrant{SignerPublic: []byte("s"), PolicyRef: []byte("r"), MaxBoots: 3}
	req := Request{NodeName: "n", DiskUUID: "u", Rejoin: true, Reattest: true}
	for _, tc := range []struct {
		name string
		t    *latchkeyv1.Ticket
		ok   bool
	}{
		{"grant", &latchkeyv1.Ticket{OfflineGrant: g}, true},
		{"withdraw", &latchkeyv1.Ticket{WithdrawOffline: true}, true},
		{"grant and key", &latchkeyv1.Ticket{OfflineGrant: g, DiskKey: bytes.Repeat([]byte{1}, 32)}, false},
	} {
		v := &scriptedVerifier{ticket: tc.t}
		var waits []time.Duration
		got, err := windowClient(t, v.serve(t), &waits, 1).Get(context.Background(), req)
		if tc.ok && (err != nil || !proto.Equal(got, tc.t)) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "the verifier answered a re-attestation with a non-empty ticket")) {
			t.Fatalf("%s: %v, want the non-empty ticket refused", tc.name, err)
		}
	}
}
