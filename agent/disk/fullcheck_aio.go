package disk

import (
	"context"
	"fmt"
	"os"
	"syscall"
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
//
// The goroutine waits for completions the way it would wait for a
// socket: the kernel counts them on an eventfd (IOCB_FLAG_RESFD), which
// the Go runtime's network poller watches, so the goroutine parks and
// its P goes idle. A wait the runtime is told of as a blocking system
// call (io_getevents through syscall.Syscall) instead keeps the
// runtime's monitor thread (sysmon) polling: each wait over 10 ms has it
// take the P away, and every return from such a call, or any announced
// system call while it sleeps, wakes it into polling every 20 µs again.
// On a VM each of its wake-ups cost 15–30 µs of CPU, and at a cloud
// disk's provisioned rate the check runs for minutes (docs/benchmarks.md).
// So the ring's own system calls are raw (the runtime is not told of
// them): io_getevents is only ever asked for what has already completed,
// and io_submit waits at most for a free slot in the device's queue.

// iocbFlagResFD has the kernel signal aioCB.resFD on completion.
const iocbFlagResFD = 1 << 0

// fullCheckPolledWait chooses the eventfd wait (the default); the
// benchmark turns it off to compare with the blocking wait, which is
// also the fallback where the eventfd cannot be had.
var fullCheckPolledWait = true

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
	if fullCheckPolledWait {
		r.ready, r.readyFD, r.readyConn = completionFD()
	}
	for i := range depth {
		r.idle = append(r.idle, i)
		r.bufs = append(r.bufs, buf[int64(i)*fullCheckChunk:int64(i+1)*fullCheckChunk])
	}
	return r, nil
}

// completionFD is an eventfd for completions, watched by the runtime's
// poller, or nils where either cannot be had (the ring then waits in
// io_getevents). The descriptor is returned apart: os.File.Fd would set
// it blocking, and a read of it would then block the thread.
func completionFD() (*os.File, int, syscall.RawConn) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, -1, nil
	}
	f := os.NewFile(uintptr(fd), "aio completions")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, -1, nil
	}
	return f, fd, rc
}

// run reads every chunk in order of submission until the end or the
// chunk holding data, and releases the ring.
func (r *aioRing) run(ctx context.Context) error {
	defer r.release()
	if r.ready != nil {
		defer r.ready.Close() // after io_destroy: no completion signals it any more
	}
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
	c         *fullChecker
	ctx       uint64
	n, next   int64 // chunks in all; next chunk to hand out
	cbs       []aioCB
	bufs      [][]byte
	idle      []int // slots free for a request
	queue     []*aioCB
	events    []aioEvent
	inFlight  int
	ready     *os.File        // the completions' eventfd; nil: wait in io_getevents
	readyFD   int             // ready's descriptor
	readyConn syscall.RawConn // ready's, to wait through the poller
	release   func()
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
		if r.ready != nil {
			r.cbs[i].flags, r.cbs[i].resFD = iocbFlagResFD, uint32(r.readyFD)
		}
		r.queue = append(r.queue, &r.cbs[i])
		r.next++
	}
}

func (r *aioRing) submit() error {
	for len(r.queue) > 0 {
		k, _, e := r.syscall(unix.SYS_IO_SUBMIT, uintptr(r.ctx), uintptr(len(r.queue)), uintptr(unsafe.Pointer(&r.queue[0])))
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

// syscall is a system call of the ring's that does not block for long:
// raw with the eventfd wait, so that it does not wake the runtime's
// monitor thread (above).
func (r *aioRing) syscall(trap, a1, a2, a3 uintptr) (uintptr, uintptr, unix.Errno) {
	if r.ready != nil {
		return unix.RawSyscall(trap, a1, a2, a3)
	}
	return unix.Syscall(trap, a1, a2, a3)
}

// reap waits for completions, then tests every completed request's data
// while it is still in the cache. A wait interrupted by a signal returns
// nothing, and run waits again.
func (r *aioRing) reap() error {
	k, err := r.wait()
	if err != nil {
		return fmt.Errorf("wait for reads of %s: %w", r.c.d.path, err)
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

// wait returns the number of completions in r.events, at least one
// unless a signal interrupted the wait. With the eventfd it takes what
// has completed and, where nothing has, parks on the eventfd until the
// kernel counts a completion (the kernel counts it after the event is
// in the ring). Without, it blocks in io_getevents for half the
// requests in flight (at least one; the other half keeps the device
// busy), fewer waits for the monitor thread to follow.
func (r *aioRing) wait() (int, error) {
	if r.ready == nil {
		k, e := getEvents(r.ctx, max(1, r.inFlight/2), r.events, false)
		return eventsOrInterrupted(k, e)
	}
	for {
		k, e := getEvents(r.ctx, 0, r.events, true)
		if k > 0 || e != 0 {
			return eventsOrInterrupted(k, e)
		}
		if err := r.parkUntilCompletion(); err != nil {
			return 0, err
		}
	}
}

// parkUntilCompletion reads (and so resets) the eventfd's count of
// completions, parking in the poller while it is zero. The count may
// include completions already taken: the next look finds nothing and
// parks again.
func (r *aioRing) parkUntilCompletion() error {
	var count uint64
	var e unix.Errno
	err := r.readyConn.Read(func(fd uintptr) bool {
		_, _, e = unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&count)), 8)
		return e != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	if e != 0 && e != unix.EINTR {
		return fmt.Errorf("read the completions' eventfd: %w", e)
	}
	return nil
}

func eventsOrInterrupted(k int, e unix.Errno) (int, error) {
	switch e {
	case 0:
		return k, nil
	case unix.EINTR:
		return 0, nil
	}
	return 0, fmt.Errorf("io_getevents: %w", e)
}

// noWait is io_getevents' timeout for a look at what has completed.
var noWait unix.Timespec

// getEvents is io_getevents(2) into events: with look, what has
// completed (a raw system call: it does not block); else blocking for
// at least minNr. A variable so that a test can interrupt it.
var getEvents = func(ctx uint64, minNr int, events []aioEvent, look bool) (int, unix.Errno) {
	call, timeout := unix.Syscall6, uintptr(0)
	if look {
		call, timeout = unix.RawSyscall6, uintptr(unsafe.Pointer(&noWait))
	}
	k, _, e := call(unix.SYS_IO_GETEVENTS, uintptr(ctx), uintptr(minNr), uintptr(len(events)),
		uintptr(unsafe.Pointer(&events[0])), timeout, 0)
	return int(k), e
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
