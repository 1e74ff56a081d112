package benchtest

import (
	"os"
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, c := range []struct {
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{nil, 0.5, 0},
		{ms(7), 0.5, 7 * time.Millisecond},
		{ms(7), 0.99, 7 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.99, 4 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.01, 1 * time.Millisecond},
		{ms(hundred...), 0.5, 50 * time.Millisecond},
		{ms(hundred...), 0.99, 99 * time.Millisecond},
		{ms(hundred...), 1, 100 * time.Millisecond},
	} {
		if got := Quantile(c.sorted, c.q); got != c.want {
			t.Errorf("Quantile(%v, %v) = %v, want %v", c.sorted, c.q, got, c.want)
		}
	}
}

// The kernel's count of this process grows with the CPU it burns, and
// agrees with getrusage's to within a few clock ticks (10 ms each).
func TestProcessCPUCountsThisProcess(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self0 := SelfCPU(t)
	for SelfCPU(t)-self0 < 100*time.Millisecond {
	}
	after, err := TreeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self := SelfCPU(t) - self0
	if got := after - before; got < self-30*time.Millisecond || got > self+30*time.Millisecond {
		t.Fatalf("/proc counts %v for a busy loop getrusage counts %v", got, self)
	}
}

func TestProcessCPURefusesAMissingProcess(t *testing.T) {
	// Pids above the kernel's pid_max (at most 2^22) never exist.
	if _, err := ProcessCPU(1 << 23); !os.IsNotExist(err) {
		t.Fatalf("err = %v, want not-exist", err)
	}
}

// typedErr is an error of its own concrete type, so FirstError sees two
// different types, which atomic.Value's CompareAndSwap panics on.
type typedErr struct{}

func (typedErr) Error() string { return "typed" }

func TestFirstErrorMixedTypes(t *testing.T) {
	var f FirstError
	if f.Err() != nil {
		t.Fatalf("zero FirstError holds %v", f.Err())
	}
	f.Set(nil)
	if f.Err() != nil {
		t.Fatalf("Set(nil) recorded %v", f.Err())
	}
	first := os.ErrNotExist
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Set(typedErr{})
	}()
	f.Set(first)
	<-done
	f.Set(&os.PathError{Op: "open", Path: "x", Err: os.ErrPermission})
	got := f.Err()
	if got != first && got != (typedErr{}) {
		t.Fatalf("Err() = %v (%T), want one of the two first errors", got, got)
	}
	f.Set(typedErr{})
	if f.Err() != got {
		t.Fatalf("a later Set replaced the first error: %v", f.Err())
	}
}
