package load

// The agents: one ticket.Client and SNP issuer each, every join a new TLS
// connection with a report freshly signed for that session.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	snpissuer "github.com/latchkey/latchkey/attest/snp/issuer"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/internal/benchtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// fleet is the set of concurrent agents.
type fleet struct {
	agents []*ticket.Client
	// issuers[i] is agents[i]'s; addr and pin the verifier's (the storm
	// makes a client per join from them).
	issuers []*snpissuer.Issuer
	addr    string
	pin     atls.Pin
	// failedAttempts counts attempts the agents retried (none expected).
	failedAttempts atomic.Int64
	firstFailure   benchtest.FirstError
	nextNode       atomic.Int64
}

func newFleet(tb testing.TB, s *snptest.Signer, addr string, pin atls.Pin, n int) *fleet {
	tb.Helper()
	f := &fleet{addr: addr, pin: pin}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range n {
		iss, err := snpissuer.New(snpissuer.Config{QuoteProvider: s.QuoteProvider(), Logger: quiet})
		if err != nil {
			tb.Fatal(err)
		}
		c, err := ticket.New(ticket.Config{
			Endpoints: []string{addr}, Pins: []atls.Pin{pin}, Issuer: iss,
			Timeout: 2 * time.Minute, AttemptTimeout: time.Minute,
			InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, RefusalBackoff: time.Second,
			Logger: quiet, OnAttemptFailed: f.attemptFailed,
		})
		if err != nil {
			tb.Fatal(err)
		}
		f.agents = append(f.agents, c)
		f.issuers = append(f.issuers, iss)
	}
	return f
}

func (f *fleet) attemptFailed(err error) {
	f.failedAttempts.Add(1)
	f.firstFailure.Set(err)
}

// join is one node's first join: a new node name and disk, a token asked
// for (and acknowledged by the ticket client).
func (f *fleet) join(ctx context.Context, c *ticket.Client) error {
	req := ticket.Request{
		NodeName: fmt.Sprintf("load-node-%d", f.nextNode.Add(1)),
		DiskUUID: uuid.NewString(), Role: latchkeyv1.Role_ROLE_WORKER,
	}
	t, err := c.Get(ctx, req)
	if err != nil {
		return err
	}
	defer clear(t.DiskKey)
	if t.GetToken() == "" {
		return errors.New("ticket carries no token")
	}
	return nil
}

// phase is the outcome of one run of joins.
type phase struct {
	name   string
	agents int
	joins  int
	wall   time.Duration
	lat    []time.Duration // of the successful joins, sorted
	failed int
	err    error // the first failure
}

func (p *phase) rate() float64 { return float64(len(p.lat)) / p.wall.Seconds() }

// pct is the q-quantile of the latencies (nearest rank).
func (p *phase) pct(q float64) time.Duration {
	return benchtest.Quantile(p.lat, q)
}

// recorder collects per-join latencies from many agents.
type recorder struct {
	mu     sync.Mutex
	lat    []time.Duration
	failed int
	err    error
}

func (r *recorder) add(d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failed++
		if r.err == nil {
			r.err = err
		}
		return
	}
	r.lat = append(r.lat, d)
}

func (r *recorder) phase(name string, agents, joins int, wall time.Duration) *phase {
	slices.Sort(r.lat)
	return &phase{name: name, agents: agents, joins: joins, wall: wall, lat: r.lat, failed: r.failed, err: r.err}
}

// closedLoop has the first k agents join back to back until n joins are
// done; with all agents, the verifier's saturated throughput. Latency here
// is bounded below by k/throughput (Little's law), whatever the verifier
// does.
func (f *fleet) closedLoop(ctx context.Context, name string, k, n int) *phase {
	rec := &recorder{lat: make([]time.Duration, 0, n)}
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range f.agents[:k] {
		wg.Go(func() {
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				t0 := time.Now()
				err := f.join(ctx, c)
				rec.add(time.Since(t0), err)
			}
		})
	}
	wg.Wait()
	return rec.phase(name, k, n, time.Since(start))
}

// paced starts n joins at a fixed rate (open loop), each taken by the
// next free agent. A join's latency counts from its scheduled start, so
// time spent waiting for a free agent is included (no coordinated
// omission).
func (f *fleet) paced(ctx context.Context, name string, n int, rate float64) *phase {
	rec := &recorder{lat: make([]time.Duration, 0, n)}
	due := make(chan time.Time, n)
	start := time.Now()
	go schedule(ctx, due, start, n, rate)
	var wg sync.WaitGroup
	for _, c := range f.agents {
		wg.Go(func() {
			for at := range due {
				err := f.join(ctx, c)
				rec.add(time.Since(at), err)
			}
		})
	}
	wg.Wait()
	return rec.phase(name, len(f.agents), n, time.Since(start))
}

// schedule sends the due time of join i at start + i/rate.
func schedule(ctx context.Context, due chan<- time.Time, start time.Time, n int, rate float64) {
	defer close(due)
	for i := range n {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return
			}
		}
		due <- at
	}
}
