// Package boundedmap is a mutex-guarded map that holds at most a fixed
// number of entries, for remembering what a process did (a write's
// result, a token it minted) so a later step can skip a request. Past
// the limit an arbitrary entry is forgotten: every user treats a missing
// entry as "ask the server", so forgetting costs a request, never a
// wrong answer.
package boundedmap

import "sync"

// Map is a bounded map; its zero value is unusable, make one with New.
type Map[K comparable, V any] struct {
	limit int
	mu    sync.Mutex
	m     map[K]V
}

// New makes a Map of at most limit entries (at least one).
func New[K comparable, V any](limit int) *Map[K, V] {
	return &Map[K, V]{limit: max(limit, 1), m: map[K]V{}}
}

// Put stores v under k, forgetting an arbitrary other entry when the map
// is full.
func (b *Map[K, V]) Put(k K, v V) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.m[k]; !ok && len(b.m) >= b.limit {
		for old := range b.m {
			delete(b.m, old)
			break
		}
	}
	b.m[k] = v
}

// Take removes the entry under k and returns it, and whether there was
// one: of two concurrent takers, one gets it.
func (b *Map[K, V]) Take(k K) (V, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.m[k]
	delete(b.m, k)
	return v, ok
}

// Len is how many entries the map holds.
func (b *Map[K, V]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
