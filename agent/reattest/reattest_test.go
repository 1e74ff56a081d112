package reattest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// scripted answers Get with one error per call and stops the loop after
// the last.
type scripted struct {
	errs []error
	reqs []ticket.Request
	stop context.CancelFunc
}

func (s *scripted) Get(_ context.Context, req ticket.Request) (*latchkeyv1.Ticket, error) {
	s.reqs = append(s.reqs, req)
	err := s.errs[len(s.reqs)-1]
	if len(s.reqs) == len(s.errs) {
		defer s.stop()
		return nil, err
	}
	return &latchkeyv1.Ticket{}, err
}

func TestLoopSurvivesEveryFailureAndAsksForNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	refused := &ticket.RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH, Detail: "pcr 9"}
	unavailable := &ticket.RefusedError{Reason: latchkeyv1.Reason_UNAVAILABLE, Detail: "down"}
	s := &scripted{errs: []error{nil, refused, fmtUnreachable(), unavailable, nil}, stop: cancel}
	var waits []time.Duration
	var results []Result
	l, err := New(Config{NodeName: "node-1", DiskUUID: "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e", Role: latchkeyv1.Role_ROLE_WORKER,
		Tickets: s, Interval: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sleep:   func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return ctx.Err() },
		Rand:    func() float64 { return float64(len(waits)%3) / 2 }, // 0, 0.5, 1
		OnRound: func(_ int, r Result, _ error) { results = append(results, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil (stopped)", err)
	}
	want := []Result{Attested, Refused, Unreachable, Unreachable}
	if len(results) != len(want) {
		t.Fatalf("results %v, want %v (the last round was stopped)", results, want)
	}
	for i := range want {
		if results[i] != want[i] {
			t.Fatalf("results %v, want %v", results, want)
		}
	}
	for _, r := range s.reqs {
		if !r.Reattest || !r.Rejoin || r.RequestToken || r.NodeName != "node-1" {
			t.Fatalf("request %+v: want a re-attestation asking for no token", r)
		}
	}
	// Jitter: 54s, 60s, 66s (±10%).
	if waits[0] != 54*time.Second || waits[1] != 60*time.Second || waits[2] != 66*time.Second {
		t.Fatalf("waits %v, want 54s 60s 66s ...", waits)
	}
}

func fmtUnreachable() error { return errors.Join(ticket.ErrUnreachable, errors.New("dial: refused")) }

func TestRoundIsBounded(t *testing.T) {
	l, err := New(Config{NodeName: "n", DiskUUID: "u", Tickets: blocking{}, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Round(context.Background())
	if r != Unreachable || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("round = %v %v, want unreachable after its timeout", r, err)
	}
}

type blocking struct{}

func (blocking) Get(ctx context.Context, _ ticket.Request) (*latchkeyv1.Ticket, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestConfigChecked(t *testing.T) {
	if _, err := New(Config{NodeName: "n", DiskUUID: "u", Tickets: blocking{}, Interval: -time.Second}); err == nil ||
		err.Error() != "reattest: negative interval or round timeout" {
		t.Fatalf("negative interval: %v", err)
	}
	if _, err := New(Config{NodeName: "n", Tickets: blocking{}}); err == nil {
		t.Fatal("no disk uuid accepted")
	}
	l, _ := New(Config{NodeName: "n", DiskUUID: "u", Tickets: blocking{}})
	if l.cfg.Interval != DefaultInterval || l.cfg.RoundTimeout != MaxRoundTimeout {
		t.Fatalf("defaults: interval %s round %s", l.cfg.Interval, l.cfg.RoundTimeout)
	}
}
