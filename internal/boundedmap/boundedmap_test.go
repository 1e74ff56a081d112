package boundedmap

import (
	"sync"
	"testing"
)

// A full map forgets one entry per new key, never more, and a key put
// again replaces its value without forgetting anything.
func TestPutStaysWithinTheLimit(t *testing.T) {
	m := New[int, string](3)
	for i := range 3 {
		m.Put(i, "v")
	}
	m.Put(1, "again")
	if n := m.Len(); n != 3 {
		t.Fatalf("after replacing a key: %d entries, want 3", n)
	}
	if v, ok := m.Take(1); !ok || v != "again" {
		t.Fatalf("take 1: %q %v", v, ok)
	}
	m.Put(1, "v")
	m.Put(10, "new")
	if n := m.Len(); n != 3 {
		t.Fatalf("past the limit: %d entries, want 3", n)
	}
	if v, ok := m.Take(10); !ok || v != "new" {
		t.Fatalf("the newest entry was forgotten: %q %v", v, ok)
	}
}

// Take hands an entry out once: of many concurrent takers, one gets it.
func TestTakeOnce(t *testing.T) {
	m := New[string, int](8)
	m.Put("k", 7)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for range 16 {
		wg.Go(func() {
			if v, ok := m.Take("k"); ok && v == 7 {
				mu.Lock()
				got++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got != 1 {
		t.Fatalf("%d takers got the entry, want 1", got)
	}
	if _, ok := m.Take("absent"); ok {
		t.Fatal("took an entry never put")
	}
}
