package reattest

import (
	"context"
	"fmt"
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

// cordonLog records cordon attempts in the same event list as the
// re-attestations, so their order is checked.
type cordonLog struct {
	events *[]string
	done   []bool
}

func (c *cordonLog) Cordon(context.Context) bool {
	*c.events = append(*c.events, "cordon")
	d := c.done[0]
	c.done = c.done[1:]
	return d
}

type eventTickets struct {
	*scripted
	events *[]string
}

func (e eventTickets) Get(ctx context.Context, req ticket.Request) (*latchkeyv1.Ticket, error) {
	*e.events = append(*e.events, "reattest")
	return e.scripted.Get(ctx, req)
}

// After an offline boot each round is preceded by a cordon attempt until
// one is done; none follows a round that attested (the verifier may
// already have lifted the cordon), even one whose cordon failed.
func TestLoopCordonsBeforeEachRoundUntilDone(t *testing.T) {
	for _, c := range []struct {
		name string
		done []bool
		errs []error
		want []string
	}{
		{"cordoned at the second attempt", []bool{false, true}, []error{fmtUnreachable(), fmtUnreachable(), nil, nil},
			[]string{"cordon", "reattest", "cordon", "reattest", "reattest", "reattest"}},
		// The API server never answered, a verifier did: the attempts end.
		{"attested before any cordon", []bool{false, false}, []error{fmtUnreachable(), nil, nil},
			[]string{"cordon", "reattest", "cordon", "reattest", "reattest"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var events []string
			s := eventTickets{&scripted{errs: c.errs, stop: cancel}, &events}
			l, err := New(Config{NodeName: "node-1", DiskUUID: "u", Tickets: s, Interval: time.Minute,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Offline: &offlineHooks{booted: true},
				Cordon: &cordonLog{events: &events, done: c.done}, Rand: func() float64 { return 0.5 },
				Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(events) != fmt.Sprint(c.want) {
				t.Fatalf("events %v, want %v", events, c.want)
			}
		})
	}
}
