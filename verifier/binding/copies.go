package binding

import (
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// maxLeaseCopies bounds the Leases a store remembers (about 2 KB each):
// past it, an arbitrary copy is forgotten, which only costs that record's
// next update a read.
const maxLeaseCopies = 8192

// leaseCopies is each binding Lease as this replica last wrote it, so
// the next optimistic update of a record it just wrote skips its read: a
// join's token after its claim, the reaper's clearing after the token,
// and the next re-attestation round of a node whose stream it serves.
// A stale copy costs one refused write: the update's resourceVersion
// precondition refuses it (Conflict), and the update reads afresh. A copy
// only ever lets a write through; every decision not to write (released,
// bound to another identity, nothing to change) is taken again on a
// fresh read.
type leaseCopies struct {
	mu sync.Mutex
	m  map[string]*coordinationv1.Lease
}

// take removes and returns the copy of the Lease named name, nil when
// there is none: one update uses it, and a concurrent one reads.
func (c *leaseCopies) take(name string) *coordinationv1.Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.m[name]
	delete(c.m, name)
	return l
}

// put remembers lease, which the caller no longer touches (the API
// server's answer to a write).
func (c *leaseCopies) put(lease *coordinationv1.Lease) {
	if lease == nil || lease.ResourceVersion == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*coordinationv1.Lease{}
	}
	if _, ok := c.m[lease.Name]; !ok && len(c.m) >= maxLeaseCopies {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[lease.Name] = lease
}
