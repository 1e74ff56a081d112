package ticket

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	cfg.Issuer = &attesttest.Issuer{}
	cfg.InsecureSkipVerifierAuth = true
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestBackoffBounds(t *testing.T) {
	c := newClient(t, Config{Endpoints: []string{"x:1"}, InitialBackoff: time.Second, MaxBackoff: 8 * time.Second, RefusalBackoff: time.Minute})
	transient := errors.New("connection refused")
	for n := 0; n < 40; n++ {
		ceil := time.Second << min(n, 3)
		if d := c.backoff(n, transient); d < 0 || d > ceil {
			t.Fatalf("transient backoff %d = %v, want within [0, %v]", n, d, ceil)
		}
	}
	refused := &RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH}
	for n := 0; n < 40; n++ {
		if d := c.backoff(n, refused); d < 30*time.Second || d > time.Minute {
			t.Fatalf("refusal backoff = %v, want within [30s, 1m]", d)
		}
	}
	unavailable := &RefusedError{Reason: latchkeyv1.Reason_UNAVAILABLE}
	if d := c.backoff(0, unavailable); d > time.Second {
		t.Fatalf("an UNAVAILABLE refusal is transient; backoff %v", d)
	}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestRotatesEndpointsAndGivesUpUnreachable(t *testing.T) {
	a, b := closedPort(t), closedPort(t)
	var seen []string
	var waits []time.Duration
	c := newClient(t, Config{Endpoints: []string{a, b}, Timeout: 2 * time.Second, AttemptTimeout: 300 * time.Millisecond,
		Start:     func(int) int { return 1 },
		OnAttempt: func(ep string, _ int) { seen = append(seen, ep) },
		Sleep: func(ctx context.Context, d time.Duration) error {
			waits = append(waits, d)
			if len(waits) >= 4 {
				return context.DeadlineExceeded
			}
			return nil
		}})
	_, err := c.Get(context.Background(), Request{NodeName: "n", DiskUUID: "u", Role: latchkeyv1.Role_ROLE_WORKER})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	if len(seen) < 4 || seen[0] != b || seen[1] != a || seen[2] != b {
		t.Fatalf("endpoints tried %v, want alternating from the start %s: %s %s", seen, b, b, a)
	}
}

func TestGiveUpKeepsTheRefusal(t *testing.T) {
	refused := &RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH, Detail: "pcr 7"}
	err := giveUp(refused, time.Minute)
	var r *RefusedError
	if !errors.As(err, &r) || errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "PCR_MISMATCH") {
		t.Fatalf("err = %v", err)
	}
	err = giveUp(&RefusedError{Reason: latchkeyv1.Reason_UNAVAILABLE}, time.Minute)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a transient refusal at the end is unreachable: %v", err)
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	if _, err := New(Config{Issuer: &attesttest.Issuer{}, InsecureSkipVerifierAuth: true}); err == nil || !strings.Contains(err.Error(), "no verifier endpoint") {
		t.Fatalf("err = %v", err)
	}
	if _, err := New(Config{Endpoints: []string{"x:1"}, InsecureSkipVerifierAuth: true}); err == nil || !strings.Contains(err.Error(), "no evidence issuer") {
		t.Fatalf("err = %v", err)
	}
}
