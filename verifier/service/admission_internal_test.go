package service

import (
	"errors"
	"testing"
	"time"
)

// The hint is a virtual queue advancing at the verifier's throughput: two
// slots, each join holding one for 400 ms, is 5 joins a second, overbooked
// to 10, so successive refusals are told 100 ms, 200 ms, ... and the queue drains
// as time passes (without the rate falling while nobody completes).
func TestRetryAfterFollowsThroughput(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAdmission(2, func() time.Time { return now })
	for range 11 {
		rel, err := a.acquire("10.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(400 * time.Millisecond)
		rel()
	}
	r1, _ := a.acquire("10.0.0.1")
	r2, _ := a.acquire("10.0.0.2")
	var hints []time.Duration
	for range 3 {
		_, err := a.acquire("10.0.0.3")
		var o *errOverloaded
		if !errors.As(err, &o) {
			t.Fatalf("err = %v, want overloaded", err)
		}
		hints = append(hints, o.retryAfter)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	for i := range want {
		if d := hints[i] - want[i]; d < -5*time.Millisecond || d > 5*time.Millisecond {
			t.Fatalf("hints %v, want about %v", hints, want)
		}
	}
	// A second later the queue's tail is in the past: one step again.
	now = now.Add(time.Second)
	_, err := a.acquire("10.0.0.3")
	var o *errOverloaded
	if !errors.As(err, &o) || o.retryAfter < 95*time.Millisecond || o.retryAfter > 105*time.Millisecond {
		t.Fatalf("after the queue drained: %v, want one step of 100ms", err)
	}
	r1()
	r2()
}

// The hint is bounded: a verifier that completes nothing does not send
// agents away for minutes.
func TestRetryAfterBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAdmission(1, func() time.Time { return now })
	rel, _ := a.acquire("a")
	defer rel()
	var last time.Duration
	for range 400 { // 50 ms each at the default slot time: 20 s
		_, err := a.acquire("b")
		var o *errOverloaded
		errors.As(err, &o)
		last = o.retryAfter
	}
	if last != maxRetryAfter {
		t.Fatalf("hint %v after 400 refusals, want the bound %v", last, maxRetryAfter)
	}
}

// The last quarter of the slots goes only to sources below their fair
// share: one flooding address cannot take every slot from the others.
func TestAdmissionFairBetweenSources(t *testing.T) {
	a := newAdmission(8, time.Now)
	var held []func()
	for range 6 { // 8 - 8/4: the unreserved slots
		rel, err := a.acquire("flood")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, rel)
	}
	if _, err := a.acquire("flood"); err != nil {
		// Alone, the flood's fair share is every slot.
		t.Fatalf("a lone source refused below its share: %v", err)
	} else {
		a.mu.Lock()
		a.inFlight-- // give the slot back without a completion
		a.bySource["flood"]--
		a.mu.Unlock()
	}
	rel, err := a.acquire("node")
	if err != nil {
		t.Fatalf("a second source refused a reserved slot: %v", err)
	}
	held = append(held, rel)
	// Two sources: the flood (6) is over its share of 4, the reserve is
	// not for it.
	if _, err := a.acquire("flood"); err == nil {
		t.Fatal("the flooding source took a reserved slot above its share")
	}
	if rel, err := a.acquire("node"); err != nil {
		t.Fatalf("the second source refused below its share: %v", err)
	} else {
		held = append(held, rel)
	}
	if _, err := a.acquire("other"); err == nil {
		t.Fatal("a slot was given past the limit")
	}
	for _, r := range held {
		r()
	}
	if a.inFlight != 0 || len(a.bySource) != 0 {
		t.Fatalf("in flight %d sources %v after every release", a.inFlight, a.bySource)
	}
}

// A join that gives its slot back for a challenge wait is one hold in the
// throughput estimate: its work before and after the wait, not two
// holds (which would double the estimated throughput and send refused
// agents back too early), and not the wait itself. Its place counts
// while it waits: per source and in all, up to the caps.
func TestChallengeWaitIsOneHold(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAdmission(4, func() time.Time { return now })
	sl, err := a.take("10.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(100 * time.Millisecond)
	if !a.park("10.0.0.1") {
		t.Fatal("no wait place for the first wait of a source")
	}
	held := sl.vacate()
	if a.inFlight != 0 || held != 100*time.Millisecond || a.meanHold != 0 {
		t.Fatalf("after vacate: in flight %d, held %v, mean hold %v; want 0, 100ms, none recorded", a.inFlight, held, a.meanHold)
	}
	now = now.Add(10 * time.Second) // the wait
	a.unpark("10.0.0.1")
	sl, err = a.take("10.0.0.1", held)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(100 * time.Millisecond)
	sl.release()
	if a.meanHold != 200*time.Millisecond || a.inFlight != 0 || a.waiting != 0 || len(a.waitingBySource) != 0 {
		t.Fatalf("mean hold %v, in flight %d, waiting %d %v; want 200ms and nothing held", a.meanHold, a.inFlight, a.waiting, a.waitingBySource)
	}
	// Caps: 2 per source at limit 4, 16 in all.
	if !a.park("s") || !a.park("s") || a.park("s") {
		t.Fatal("per-source cap: want exactly 2 places for one source")
	}
	for i := range 14 {
		if !a.park(string(rune('a' + i))) {
			t.Fatalf("place %d of 16 refused", 3+i)
		}
	}
	if a.park("z") {
		t.Fatal("a 17th wait place granted")
	}
}

// acquire is take for a join that held no slot before; the release
// function must be called once the join ends.
func (a *admission) acquire(src string) (func(), error) {
	sl, err := a.take(src, 0)
	if err != nil {
		return nil, err
	}
	return sl.release, nil
}
