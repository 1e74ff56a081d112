package service

import (
	"context"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/metrics"
)

// Admission control for boot storms: at most Limit joins are past their
// Hello at once. A join over the limit is answered at once with
// RESOURCE_EXHAUSTED and a retry-after hint instead of queueing until its
// timeout, so a storm larger than the verifier's capacity is served at the
// verifier's own pace: admitted joins keep their unloaded latency, memory
// stays bounded by the limit, and the others come back when a slot is
// likely free.
//
// The hint is a virtual queue: each refused join is given the next free
// place in a schedule that advances at the verifier's throughput (Limit
// over the mean time a join holds its slot), so a thousand refused agents
// come back spread over the time the verifier needs for them rather than
// all at once. The agent adds jitter.
//
// Fairness between sources (peer IP addresses): the last quarter of the
// slots goes only to sources holding fewer than their fair share
// (Limit / sources in flight), so one address flooding the port cannot
// keep every other node out.
//
// Challenge waits: a join waiting for its challenge answer does no work
// of the verifier's, and before that answer nothing proves the caller has
// a TPM (a client with a software "AK" and another machine's EK
// certificate gets the challenge and can simply never answer). So while
// it waits (at most Config.ChallengeTimeout) the join gives its slot back
// and holds a challenge-wait place instead; with the answer it takes a
// slot again (or is answered RESOURCE_EXHAUSTED like any join over the
// limit). Wait places are capped at Limit/2 per source and 4 x Limit in
// all: a join that finds none keeps its slot while it waits, as before,
// bounded by the challenge timeout. Real joins therefore get a slot
// however many addresses hold unanswered challenges, and those addresses
// cost the verifier a bounded number of idle streams.

// Bounds of the retry-after hint.
const (
	minRetryAfter = 20 * time.Millisecond
	maxRetryAfter = 10 * time.Second
	// overbook schedules returns this many times faster than the
	// estimated throughput: an agent that comes back to a full verifier
	// costs one handshake and one more hint, a slot left idle because
	// agents were sent too far out costs throughput, and the slot time
	// measured in a storm includes the contention of the refusals
	// themselves (load benchmark: with 1, a 3x storm was served at a
	// third of capacity).
	overbook = 2.0
	// defaultHold is the assumed slot time before any join ended.
	defaultHold = 100 * time.Millisecond
	// holdWeight is the weight of the latest join in meanHold.
	holdWeight = 0.2
)

// DefaultMaxInFlight is the admission limit when none is configured:
// validation is CPU-bound (signature checks), so a few joins per core keep
// every core busy while the rest wait for their challenge round trips and
// the API server.
func DefaultMaxInFlight() int { return 8 * runtime.GOMAXPROCS(0) }

// admission holds the in-flight count per source and the completion
// history the retry-after hint is derived from.
type admission struct {
	limit int
	now   func() time.Time

	mu       sync.Mutex
	inFlight int
	bySource map[string]int
	// waiting and waitingBySource count the challenge-wait places.
	waiting         int
	waitingBySource map[string]int
	// meanHold is the weighted mean time a join holds its slot.
	meanHold time.Duration
	// next is the virtual queue's tail: when the last refused join was
	// told to come back.
	next time.Time
}

func newAdmission(limit int, now func() time.Time) *admission {
	if limit <= 0 {
		limit = DefaultMaxInFlight()
	}
	return &admission{limit: limit, now: now, bySource: map[string]int{}, waitingBySource: map[string]int{}}
}

// maxWaiting and maxWaitingPerSource cap the challenge-wait places.
func (a *admission) maxWaiting() int          { return 4 * a.limit }
func (a *admission) maxWaitingPerSource() int { return max(1, a.limit/2) }

// park takes a challenge-wait place for src if one is free.
func (a *admission) park(src string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting >= a.maxWaiting() || a.waitingBySource[src] >= a.maxWaitingPerSource() {
		return false
	}
	a.waiting++
	a.waitingBySource[src]++
	return true
}

// unpark gives a challenge-wait place back.
func (a *admission) unpark(src string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waiting--
	if a.waitingBySource[src]--; a.waitingBySource[src] <= 0 {
		delete(a.waitingBySource, src)
	}
}

// errOverloaded is the refusal of a join over the admission limit.
type errOverloaded struct{ retryAfter time.Duration }

func (e *errOverloaded) Error() string {
	return "verifier at its admission limit, retry in " + e.retryAfter.Round(time.Millisecond).String()
}

// sourceOf is the peer's IP address ("" when unknown: one shared source).
func sourceOf(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return p.Addr.String()
}

// slot is one admission slot taken for src. start is when the join's
// work began, earlier than the take when the join held a slot before a
// challenge wait (take's held), so the hold the throughput estimate
// records is the join's whole work time, not its pieces.
type slot struct {
	a     *admission
	src   string
	start time.Time
}

// take takes a slot for src, crediting held (time the join already held
// a slot) to it, or returns *errOverloaded with the hint.
func (a *admission) take(src string, held time.Duration) (*slot, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.admits(src) {
		return nil, &errOverloaded{retryAfter: a.retryAfterLocked()}
	}
	a.inFlight++
	a.bySource[src]++
	return &slot{a: a, src: src, start: a.now().Add(-held)}, nil
}

// release gives the slot back at the end of the join, recording the
// join's hold.
func (s *slot) release() {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	s.a.vacateLocked(s.src)
	s.a.recordHoldLocked(s.a.now().Sub(s.start))
}

// vacate gives the slot back for a challenge wait without recording a
// hold, and returns the time held so far (for take's held).
func (s *slot) vacate() time.Duration {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	s.a.vacateLocked(s.src)
	return s.a.now().Sub(s.start)
}

// admits reports whether src may take a slot now.
func (a *admission) admits(src string) bool {
	if a.inFlight >= a.limit {
		return false
	}
	reserved := a.limit / 4
	if a.inFlight < a.limit-reserved {
		return true
	}
	sources := len(a.bySource)
	if a.bySource[src] == 0 {
		sources++
	}
	return a.bySource[src] < max(1, a.limit/sources)
}

func (a *admission) vacateLocked(src string) {
	a.inFlight--
	if a.bySource[src]--; a.bySource[src] <= 0 {
		delete(a.bySource, src)
	}
}

// recordHoldLocked adds one join's hold to the weighted mean.
func (a *admission) recordHoldLocked(held time.Duration) {
	if a.meanHold <= 0 {
		a.meanHold = held
	} else {
		a.meanHold += time.Duration(holdWeight * float64(held-a.meanHold))
	}
}

// rateLocked is the verifier's throughput when every slot is taken,
// which is whenever a join is refused: by Little's law, the limit over the
// mean time a join holds its slot (an exponentially weighted mean over
// recent joins; 100 ms before any). It does not fall when the refused
// agents are away, as a count of recent completions would: that feedback
// sent agents ever further out while the verifier sat idle.
func (a *admission) rateLocked() float64 {
	hold := a.meanHold
	if hold <= 0 {
		hold = defaultHold
	}
	return float64(a.limit) / hold.Seconds()
}

// retryAfterLocked places one more refused join at the tail of the
// virtual queue, 1/rate after the one before it.
func (a *admission) retryAfterLocked() time.Duration {
	now := a.now()
	step := time.Duration(float64(time.Second) / (overbook * a.rateLocked()))
	if a.next.Before(now) {
		a.next = now
	}
	a.next = a.next.Add(step)
	d := a.next.Sub(now)
	if d > maxRetryAfter {
		// The queue is longer than a client should wait for one answer:
		// stop growing it, so the tail does not drift ever further out.
		a.next = now.Add(maxRetryAfter)
		d = maxRetryAfter
	}
	return max(d, minRetryAfter)
}

// joinSlot is a join's admission slot and its in-flight metric.
type joinSlot struct {
	slot *slot
	m    *metrics.Metrics
}

func (j *joinSlot) release() { j.m.InFlight(-1); j.slot.release() }

func (j *joinSlot) vacate() time.Duration { j.m.InFlight(-1); return j.slot.vacate() }

// admit is the join's admission step, after its Hello (held 0) or after a
// challenge wait (held: the time it held a slot before): a slot, or a
// refusal the agent retries after the hint.
func (s *Service) admit(ctx context.Context, held time.Duration) (*joinSlot, error) {
	sl, err := s.adm.take(sourceOf(ctx), held)
	if err != nil {
		s.cfg.Metrics.AdmissionRefused()
		return nil, err
	}
	s.cfg.Metrics.InFlight(1)
	return &joinSlot{slot: sl, m: s.cfg.Metrics}, nil
}

// parkForChallenge gives the join's slot back while it waits for a
// challenge answer, when a challenge-wait place is free for its source,
// and returns what ends the wait: with an answer, it takes a slot again
// and returns nil, or the refusal of a join over the limit (UNAVAILABLE
// wrapping *errOverloaded, so the agent gets RESOURCE_EXHAUSTED and the
// retry hint); without one (the join is ending) it only gives the place
// back. Without a free place the join keeps its slot and resume does
// nothing.
func (s *Service) parkForChallenge(ctx context.Context, out *outcome) (resume func(answered bool) error) {
	src := sourceOf(ctx)
	if out.slot == nil || !s.adm.park(src) {
		return func(bool) error { return nil }
	}
	held := out.slot.vacate()
	out.slot = nil
	return func(answered bool) error {
		s.adm.unpark(src)
		if !answered {
			return nil
		}
		j, err := s.admit(ctx, held)
		if err != nil {
			return attest.Refuse(latchkeyv1.Reason_UNAVAILABLE, "no admission slot after the challenge: %w", err)
		}
		out.slot = j
		return nil
	}
}

// releaseSlot gives the join's admission slot back, once: before the
// handover, since waiting for the agent's TicketAck is no work of the
// verifier's and a slow agent must not hold a slot others could use.
func (o *outcome) releaseSlot() {
	if o.slot != nil {
		o.slot.release()
		o.slot = nil
	}
}

// overloadedRefusal is the detail toStatus sends for *errOverloaded.
func overloadedRefusal(e *errOverloaded) *latchkeyv1.Refusal {
	return &latchkeyv1.Refusal{
		Reason:       latchkeyv1.Reason_UNAVAILABLE,
		Detail:       "verifier busy: retry after the hint",
		RetryAfterMs: uint32(e.retryAfter.Milliseconds()),
	}
}
