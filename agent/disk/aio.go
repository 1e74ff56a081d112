package disk

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux native AIO (io_submit) for the blank-device scan: with O_DIRECT
// on a block device the reads are truly asynchronous, so one goroutine
// keeps over a hundred small reads in flight with a handful of system
// calls, where blocking preads cost a thread switch each (about 4x the
// wall time and 7x the CPU on a loop device, docs/benchmarks.md).
// golang.org/x/sys has no wrappers, so the ABI structs are declared
// here (include/uapi/linux/aio_abi.h, little-endian field order).

type aioCB struct {
	data      uint64
	key       uint32
	rwFlags   uint32
	opcode    uint16
	reqPrio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resFD     uint32
}

type aioEvent struct {
	data, obj uint64
	res, res2 int64
}

const aioPRead = 0 // IOCB_CMD_PREAD

// candidate slots in flight; each has one read per probe window.
const aioSlots = 48

// errNoAIO: the kernel (or a seccomp filter) refused io_setup; the scan
// falls back to blocking preads.
var errNoAIO = errors.New("linux AIO not available")

// useAIO can be turned off by tests to exercise the pread path.
var useAIO = true

type aioSlot struct {
	cand    int64
	pending int
	bufs    [][]byte
	got     [][]byte
}

// probeAIO reads the probe windows of every candidate in far through
// io_submit and checks each candidate when all its windows are in.
func (s *scanner) probeAIO(ctx context.Context, fd int, far candidates) error {
	if !useAIO {
		return errNoAIO
	}
	nw := len(probeWindows)
	depth := aioSlots * nw
	var aioCtx uint64
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, uintptr(depth), uintptr(unsafe.Pointer(&aioCtx)), 0); e != 0 {
		return fmt.Errorf("%w: io_setup: %v", errNoAIO, e)
	}
	defer unix.Syscall(unix.SYS_IO_DESTROY, uintptr(aioCtx), 0, 0) // waits for (or cancels) what is in flight

	slots := make([]aioSlot, aioSlots)
	cbs := make([]aioCB, depth)
	free := make([]int, 0, aioSlots)
	for i := range slots {
		slots[i].bufs = make([][]byte, nw)
		slots[i].got = make([][]byte, nw)
		for j, w := range probeWindows {
			slots[i].bufs[j] = alignedBuffer(s.windowLen(w.n))
		}
		free = append(free, i)
	}
	events := make([]aioEvent, depth)
	queue := make([]*aioCB, 0, depth) // prepared, not yet taken by the kernel
	next, inFlight := int64(0), 0
	for (next < far.n && !s.stop.Load()) || inFlight > 0 || len(queue) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		for len(free) > 0 && next < far.n && !s.stop.Load() {
			i := free[len(free)-1]
			free = free[:len(free)-1]
			sl := &slots[i]
			sl.cand, sl.pending = far.at(next), 0
			next++
			for j, w := range probeWindows {
				sl.got[j] = nil
				off, n := sl.cand+w.off, s.windowLen(w.n)
				if off+n > s.d.size || s.buffered(off, n) {
					continue
				}
				cb := &cbs[i*nw+j]
				*cb = aioCB{data: uint64(i*nw + j), opcode: aioPRead, fildes: uint32(fd),
					buf: uint64(uintptr(unsafe.Pointer(&sl.bufs[j][0]))), nbytes: uint64(n), offset: off}
				queue = append(queue, cb)
				sl.pending++
			}
			if sl.pending == 0 {
				s.finishSlot(sl)
				free = append(free, i)
			}
		}
		if len(queue) > 0 {
			r, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, uintptr(aioCtx), uintptr(len(queue)), uintptr(unsafe.Pointer(&queue[0])))
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				if inFlight == 0 {
					return fmt.Errorf("io_submit on %s: %v with nothing in flight", s.d.path, e)
				}
			case e != 0:
				return fmt.Errorf("io_submit on %s: %v", s.d.path, e)
			default:
				inFlight += int(r)
				queue = queue[:copy(queue, queue[r:])]
			}
		}
		if inFlight == 0 {
			continue
		}
		r, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, uintptr(aioCtx), 1, uintptr(len(events)), uintptr(unsafe.Pointer(&events[0])), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return fmt.Errorf("io_getevents on %s: %v", s.d.path, e)
		}
		for _, ev := range events[:r] {
			inFlight--
			i, j := int(ev.data)/nw, int(ev.data)%nw
			sl := &slots[i]
			want := int64(cbs[ev.data].nbytes)
			if ev.res != want {
				return fmt.Errorf("read %s at %d: %d of %d bytes (%v)", s.d.path, cbs[ev.data].offset, ev.res, want, unix.Errno(-min(ev.res, 0)))
			}
			sl.got[j] = sl.bufs[j][:want]
			if k := firstNonZero(sl.got[j]); k >= 0 {
				s.noteData(cbs[ev.data].offset + int64(k))
			}
			if sl.pending--; sl.pending == 0 {
				s.finishSlot(sl)
				free = append(free, i)
			}
		}
	}
	return nil
}

func (s *scanner) finishSlot(sl *aioSlot) {
	c, got := sl.cand, sl.got
	s.checkCandidate(c, func(off, n int64) []byte {
		for j, w := range probeWindows {
			if got[j] != nil && off >= w.off && off+n <= w.off+int64(len(got[j])) {
				return got[j][off-w.off : off-w.off+n]
			}
		}
		return s.memView(c)(off, n)
	})
}
