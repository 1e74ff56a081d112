package disk

import (
	"context"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The full check's reads through Linux native AIO: one goroutine keeps
// fullCheckDepth requests of fullCheckChunk in flight and tests each
// request's data for zero as soon as it lands, while it is still in the
// CPU cache the device (or the loop driver) wrote it through. Blocking
// preads need a thread per request in flight, and a thread switch each;
// large requests (to keep a device busy with few threads) are out of the
// cache by the time they are tested (docs/benchmarks.md).

// newAIORing sets up the reads of chunks 0..n-1; it returns an error
// wrapping errNoAIO, before reading anything, where AIO is refused.
func (c *fullChecker) newAIORing(n int64) (*aioRing, error) {
	if !useAIO {
		return nil, errNoAIO
	}
	depth := int(min(fullCheckDepth, n))
	buf, release, err := directBuffer(int64(depth) * fullCheckChunk)
	if err != nil {
		return nil, err
	}
	r := &aioRing{c: c, n: n, release: release, cbs: make([]aioCB, depth),
		events: make([]aioEvent, depth), queue: make([]*aioCB, 0, depth)}
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, uintptr(depth), uintptr(unsafe.Pointer(&r.ctx)), 0); e != 0 {
		release()
		return nil, fmt.Errorf("%w: io_setup: %v", errNoAIO, e)
	}
	for i := range depth {
		r.idle = append(r.idle, i)
		r.bufs = append(r.bufs, buf[int64(i)*fullCheckChunk:int64(i+1)*fullCheckChunk])
	}
	return r, nil
}

// run reads every chunk in order of submission until the end or the
// chunk holding data, and releases the ring.
func (r *aioRing) run(ctx context.Context) error {
	defer r.release()
	defer unix.Syscall(unix.SYS_IO_DESTROY, uintptr(r.ctx), 0, 0) // waits for (or cancels) what is in flight; runs before release
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.fill()
		if err := r.submit(); err != nil {
			return err
		}
		if r.inFlight == 0 && len(r.queue) == 0 {
			return nil
		}
		if err := r.reap(); err != nil {
			return err
		}
	}
}

// aioRing is the state of one AIO full check.
type aioRing struct {
	c        *fullChecker
	ctx      uint64
	n, next  int64 // chunks in all; next chunk to hand out
	cbs      []aioCB
	bufs     [][]byte
	idle     []int // slots free for a request
	queue    []*aioCB
	events   []aioEvent
	inFlight int
	release  func()
}

// fill prepares a request for every idle slot, in chunk order, up to the
// chunk holding the lowest non-zero byte seen.
func (r *aioRing) fill() {
	c := r.c
	for len(r.idle) > 0 && r.next < r.n {
		off := c.from + r.next*fullCheckChunk
		if off > c.found.Load() {
			r.next = r.n // no later chunk is needed
			return
		}
		i := r.idle[len(r.idle)-1]
		r.idle = r.idle[:len(r.idle)-1]
		b := r.bufs[i][:min(fullCheckChunk, c.d.size-off)]
		r.cbs[i] = aioCB{data: uint64(i), opcode: aioPRead, fildes: uint32(c.fd),
			buf: uint64(uintptr(unsafe.Pointer(&b[0]))), nbytes: uint64(len(b)), offset: off}
		r.queue = append(r.queue, &r.cbs[i])
		r.next++
	}
}

func (r *aioRing) submit() error {
	for len(r.queue) > 0 {
		k, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, uintptr(r.ctx), uintptr(len(r.queue)), uintptr(unsafe.Pointer(&r.queue[0])))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			if r.inFlight == 0 {
				return fmt.Errorf("io_submit on %s: %v with nothing in flight", r.c.d.path, e)
			}
			return nil
		case e != 0:
			return fmt.Errorf("io_submit on %s: %v", r.c.d.path, e)
		}
		r.inFlight += int(k)
		r.queue = r.queue[:copy(r.queue, r.queue[k:])]
	}
	return nil
}

// reap waits for half the requests in flight (at least one; the other
// half keeps the device busy), then tests every completed request's data
// while it is still in the cache. Waiting for several at once matters:
// each wait is a blocking system call, after which the Go runtime's
// monitor thread polls every 20 µs for a while (docs/benchmarks.md).
func (r *aioRing) reap() error {
	k, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, uintptr(r.ctx), uintptr(max(1, r.inFlight/2)), uintptr(len(r.events)), uintptr(unsafe.Pointer(&r.events[0])), 0, 0)
	if e == unix.EINTR {
		return nil
	}
	if e != 0 {
		return fmt.Errorf("io_getevents on %s: %v", r.c.d.path, e)
	}
	for _, ev := range r.events[:k] {
		r.inFlight--
		cb := &r.cbs[ev.data]
		if ev.res != int64(cb.nbytes) {
			return fmt.Errorf("read %s at %d: %d of %d bytes (%v)", r.c.d.path, cb.offset, ev.res, cb.nbytes, unix.Errno(-min(ev.res, 0)))
		}
		r.c.done.Add(int64(cb.nbytes))
		if j := firstNonZeroFast(r.bufs[ev.data][:cb.nbytes]); j >= 0 {
			r.c.lower(cb.offset + int64(j))
		}
		r.idle = append(r.idle, int(ev.data))
	}
	return nil
}

// directBuffer maps n bytes for direct I/O outside the Go heap (no
// garbage collector scans or zeroes it), asks for transparent huge pages
// (fewer pages for the kernel to pin per request) and faults every page
// in before the first read.
func directBuffer(n int64) ([]byte, func(), error) {
	const huge = 2 << 20
	raw, err := unix.Mmap(-1, 0, int(n+huge), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("map the blank-check buffer: %w", err)
	}
	skip := (huge - int(uintptr(unsafe.Pointer(&raw[0]))&(huge-1))) & (huge - 1)
	b := raw[skip : skip+int(n)]
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // advisory: 4 KiB pages work too
	for i := 0; i < len(b); i += 4096 {
		b[i] = 0
	}
	return b, func() { _ = unix.Munmap(raw) }, nil
}
