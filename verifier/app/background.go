package app

import (
	"sync"
	"sync/atomic"
)

// background owns the goroutines Serve starts (policy reloads, metrics,
// the admin API, the CSR approver, the token reaper, the revoker of
// denied nodes' tokens, the join server):
// each runs until Serve's context ends or its server is stopped, and
// Serve returns only after every one of them has returned. So nothing
// (a policy reload, a CSR decision, a scrape, an admin call) still runs
// once Serve has wiped the master secret and the process says it
// stopped, and a test's next verifier never races the last one's.
type background struct {
	wg      sync.WaitGroup
	running atomic.Int32
}

// Go runs f in its own goroutine, owned by b.
func (b *background) Go(f func()) {
	b.running.Add(1)
	b.wg.Go(func() {
		defer b.running.Add(-1)
		f()
	})
}

// Wait returns once every goroutine started with Go has returned.
func (b *background) Wait() { b.wg.Wait() }
