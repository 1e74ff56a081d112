package ticket

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/internal/pkitest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// tlsVerifier is a TLS 1.3 listener with a fresh self-signed certificate
// that completes handshakes and nothing more.
func tlsVerifier(t *testing.T) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", atls.ServerConfig(pkitest.SelfSigned(t, "impostor").TLSCertificate()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	return lis.Addr().String()
}

// A verifier whose certificate matches no pin is reported as such (its
// own error), never as "unreachable", and no evidence is made for it.
// Once every configured verifier has answered so, the agent gives up at
// once: waiting cannot fix a wrong pin. Until then it retries slowly.
func TestWrongPinIsItsOwnError(t *testing.T) {
	pins, err := atls.ParsePins([]string{"sha256:" + strings.Repeat("ab", 32)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		endpoints []string
		waits     int
	}{
		{"one verifier", []string{tlsVerifier(t)}, 0},
		{"two verifiers", []string{tlsVerifier(t), tlsVerifier(t)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			issuer := &attesttest.Issuer{}
			var waits []time.Duration
			c, err := New(Config{Endpoints: tc.endpoints, Pins: pins, Issuer: issuer, Timeout: time.Minute,
				RefusalBackoff: time.Minute, Start: func(int) int { return 0 },
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Sleep: func(ctx context.Context, d time.Duration) error {
					waits = append(waits, d)
					return nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Get(context.Background(), Request{NodeName: "n", DiskUUID: "u", Role: latchkeyv1.Role_ROLE_WORKER})
			if !errors.Is(err, atls.ErrPinMismatch) || errors.Is(err, ErrUnreachable) ||
				!strings.Contains(err.Error(), "no configured verifier matches the pins") || !strings.Contains(err.Error(), "leaf is sha256:") {
				t.Fatalf("err = %v, want a pin mismatch naming the leaf, at once", err)
			}
			if len(waits) != tc.waits {
				t.Fatalf("waited %v, want %d slow retries", waits, tc.waits)
			}
			for _, w := range waits {
				if w < 30*time.Second {
					t.Fatalf("retry wait %v, want the slow refusal backoff", w)
				}
			}
			if issuer.Calls.Load() != 0 {
				t.Fatalf("evidence was made %d times for an unauthenticated verifier", issuer.Calls.Load())
			}
		})
	}
}

// SIGTERM (the parent context cancelled) is a stop, not a timeout.
func TestStopIsNotUnreachable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := newClient(t, Config{Endpoints: []string{closedPort(t)}, Timeout: time.Hour, AttemptTimeout: time.Second,
		Sleep: func(context.Context, time.Duration) error { cancel(); return context.Canceled }})
	_, err := c.Get(ctx, Request{NodeName: "n", DiskUUID: "u", Role: latchkeyv1.Role_ROLE_WORKER})
	if !errors.Is(err, ErrStopped) || errors.Is(err, ErrUnreachable) || strings.Contains(err.Error(), "after 1h") {
		t.Fatalf("err = %v, want ErrStopped", err)
	}
}
