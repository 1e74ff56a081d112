package reattest

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// offlineHooks is a boot that unlocked offline: booted until a ticket
// arrives.
type offlineHooks struct {
	booted  bool
	tickets int
	refused []error
}

func (o *offlineHooks) BootedOffline() bool { return o.booted }
func (o *offlineHooks) OfflineHello() *latchkeyv1.OfflineState {
	return &latchkeyv1.OfflineState{Held: true, BootedOffline: o.booted, Boot: 2, MaxBoots: 5}
}
func (o *offlineHooks) OfflineTicket(context.Context, *latchkeyv1.Ticket) {
	o.tickets++
	o.booted = false
}
func (o *offlineHooks) OfflineRefused(_ context.Context, err error) {
	o.refused = append(o.refused, err)
}

// After an offline boot the loop re-attests at once and then after short
// pauses until a verifier attests the node, reporting booted_offline;
// then it goes back to the interval.
func TestLoopAfterOfflineBoot(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	refused := &ticket.RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH, WithdrawOffline: true}
	s := &scripted{errs: []error{fmtUnreachable(), refused, nil, nil}, stop: cancel}
	hooks := &offlineHooks{booted: true}
	var waits []time.Duration
	l, err := New(Config{NodeName: "node-1", DiskUUID: "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e", Tickets: s, Interval: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Offline: hooks, Rand: func() float64 { return 0.5 },
		Sleep: func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return ctx.Err() }})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, OfflineRetry, OfflineRetry, time.Minute}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	for i, r := range s.reqs[:3] {
		if r.Offline == nil || !r.Offline.BootedOffline || r.Offline.Boot != 2 || r.Offline.MaxBoots != 5 {
			t.Fatalf("request %d: Hello.offline %v, want booted offline, boot 2 of 5", i, r.Offline)
		}
	}
	if s.reqs[3].Offline.BootedOffline || hooks.tickets != 2 || len(hooks.refused) != 2 || hooks.refused[1] != error(refused) {
		t.Fatalf("after the re-attestation: Hello %v, tickets %d, refusals %v", s.reqs[3].Offline, hooks.tickets, hooks.refused)
	}
}
