package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/internal/logkey"
)

// The full blank-device check (the default, disk.blankCheck: full): a
// first boot destroys the whole device, so it formats only a device it
// has read in full and found zero. Sampling cannot prove that: a small
// file system, a key file or a boot stage at an unaligned offset fits
// between any samples (docs/disk.md, "The blank-device rule").
//
// The read runs at the device's sequential speed: O_DIRECT (no page-cache
// pollution, no readahead), 4 MiB aligned requests, four in flight
// through Linux AIO from one goroutine that waits on an eventfd through
// the runtime's poller (fullcheck_aio.go; the block layer splits each
// request into the device's largest and queues them all),
// into one reused, pre-faulted buffer on huge pages, and a zero test
// (firstNonZeroFast) that costs a fraction of the read. Where AIO is
// refused, two goroutines read with blocking preads instead (on a small
// machine more threads only compete with the device's own worker for
// the CPU: docs/benchmarks.md). The first non-zero byte is found at its
// exact offset: chunks are handed out in order, and once one holds data
// no later chunk is read, while the earlier ones in flight still finish.

const (
	// progressEvery is how often a long check logs its progress and
	// extends systemd's start timeout.
	progressEvery = 5 * time.Second
)

// fullCheckChunk and fullCheckDepth (requests in flight through AIO) are
// variables for the benchmark.
var fullCheckChunk, fullCheckDepth int64 = 4 * mib, 4

// preadWorkers is the blocking-pread fallback's requests in flight.
const preadWorkers = 2

// firstNonZero returns the offset of the first non-zero byte, or -1.
func firstNonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
}

// allZero reports whether every byte of b is zero.
func allZero(b []byte) bool { return firstNonZero(b) < 0 }

// firstNonZeroFast returns the offset of b's first non-zero byte, or -1.
// b is all zero exactly when its first byte is zero and every byte
// equals the one before it: bytes.Equal(b[1:], b[:len(b)-1]) is the
// runtime's vectorised memequal over a single stream (both operands are
// the same cache lines), twice as fast as comparing against a zero block
// (docs/benchmarks.md). Only a non-zero chunk is scanned byte by byte.
func firstNonZeroFast(b []byte) int {
	if len(b) == 0 || (b[0] == 0 && bytes.Equal(b[1:], b[:len(b)-1])) {
		return -1
	}
	return firstNonZero(b)
}

// Progress receives a long check's progress (for systemd: STATUS= and
// EXTEND_TIMEOUT_USEC=).
type Progress func(status string, extend time.Duration)

// fullCheck reads d from byte from to its end and returns the offset of
// the first non-zero byte, or -1 when every byte is zero.
func (l *LUKS) fullCheck(ctx context.Context, d *device, from int64) (int64, error) {
	f, err := openDirect(d)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	c := &fullChecker{fd: int(f.Fd()), d: d, from: from}
	c.found.Store(d.size)
	n := (d.size - from + fullCheckChunk - 1) / fullCheckChunk
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	if r, err := c.newAIORing(n); err == nil {
		go func() { defer close(done); err = r.run(ctx) }()
		l.watch(d, c, done)
		return c.result(err)
	} else if !errors.Is(err, errNoAIO) {
		return 0, err
	}
	var wg sync.WaitGroup
	errs := make(chan error, preadWorkers)
	for range min(preadWorkers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.worker(ctx, n); err != nil {
				errs <- err
				cancel()
			}
		}()
	}
	done = make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	l.watch(d, c, done)
	close(errs)
	return c.result(<-errs)
}

// result is the check's answer once its reads are over.
func (c *fullChecker) result(err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	if off := c.found.Load(); off < c.d.size {
		return off, nil
	}
	return -1, nil
}

// watch reports progress every progressEvery until done is closed.
func (l *LUKS) watch(d *device, c *fullChecker, done <-chan struct{}) {
	start := l.cfg.Now()
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	total := d.size - c.from
	for {
		select {
		case <-done:
			l.report(d, "done", c.done.Load(), total, l.cfg.Now().Sub(start))
			return
		case <-t.C:
			l.report(d, "progress", c.done.Load(), total, l.cfg.Now().Sub(start))
		}
	}
}

func (l *LUKS) report(d *device, what string, done, total int64, took time.Duration) {
	rate := 0.0
	if took > 0 {
		rate = float64(done) / took.Seconds() / 1e6
	}
	status := fmt.Sprintf("checking that the state disk %s is blank: %d of %d bytes read (%.0f%%, %.0f MB/s)",
		d.path, done, total, 100*float64(done)/float64(max(total, 1)), rate)
	l.cfg.Logger.Info("state disk: blank check "+what, slog.String(logkey.Device, d.path),
		slog.Int64(logkey.BytesRead, done), slog.Int64(logkey.BytesTotal, total),
		slog.Float64(logkey.RateMBs, rate), slog.Duration(logkey.Elapsed, took))
	if l.cfg.Progress != nil {
		l.cfg.Progress(status, 6*progressEvery)
	}
}

// fullChecker is one run of the full check.
type fullChecker struct {
	fd    int
	d     *device
	from  int64
	next  atomic.Int64 // next chunk index to hand out
	done  atomic.Int64 // bytes read
	found atomic.Int64 // lowest non-zero offset seen (d.size: none)
}

func (c *fullChecker) worker(ctx context.Context, n int64) error {
	buf := alignedBuffer(fullCheckChunk)
	for {
		i := c.next.Add(1) - 1
		off := c.from + i*fullCheckChunk
		if i >= n || off > c.found.Load() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		b := buf[:min(fullCheckChunk, c.d.size-off)]
		if err := preadFull(c.fd, b, off); err != nil {
			return fmt.Errorf("read %s at %d: %w", c.d.path, off, err)
		}
		c.done.Add(int64(len(b)))
		if k := firstNonZeroFast(b); k >= 0 {
			c.lower(off + int64(k))
		}
	}
}

// lower records off if it is below the lowest non-zero offset seen.
func (c *fullChecker) lower(off int64) {
	for {
		cur := c.found.Load()
		if off >= cur || c.found.CompareAndSwap(cur, off) {
			return
		}
	}
}

func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("unexpected end of device")
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// openDirect opens d again (the same device, through its descriptor) for
// direct I/O; a device that refuses O_DIRECT is read through the page
// cache instead.
func openDirect(d *device) (*os.File, error) {
	self := fmt.Sprintf("/proc/self/fd/%d", d.f.Fd())
	f, err := os.OpenFile(self, os.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EINVAL) {
		f, err = os.OpenFile(self, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s for the blank-device check: %w", d.path, err)
	}
	return f, nil
}

// nameData describes the first non-zero byte at off for a refusal: the
// format whose first non-zero byte lies exactly there (each signature of
// the table checked at its format's leads before off, none starting
// below floor), the end-relative ones when it lies in the last
// 4 MiB, libblkid's view when off is sector-aligned, else "unrecognised".
// Only exact explanations are named: checking every offset before off
// would, on random data, now and then match a two-byte magic.
func (l *LUKS) nameData(ctx context.Context, d *device, off, floor int64) (string, error) {
	if off >= d.size-tailScanLength {
		tail, err := d.read(d.size-tailScanLength, tailScanLength)
		if err != nil {
			return "", err
		}
		s := &scanner{d: d, tail: tail, tailOff: d.size - tailScanLength}
		s.checkEnd()
		if s.res.sig != nil {
			return describeAt(s.res.sig.what, s.res.sig.off, off), nil
		}
	}
	views := map[int64]view{}
	for _, sg := range signatures {
		for _, lead := range sg.leads {
			// The format's first bytes may be zero themselves (an ext4
			// superblock's inode count), so its start is also looked
			// for at the sector boundary at or before off - lead.
			for _, c := range []int64{off - lead, (off - lead) &^ 511} {
				if c < floor {
					continue
				}
				if views[c] == nil {
					buf, err := d.read(c, int(min(d.size-c, probeSpan)))
					if err != nil {
						return "", err
					}
					views[c] = bufView(buf, 0)
				}
				if sg.match(views[c]) {
					return describeAt(sg.what, c, off), nil
				}
			}
		}
	}
	if off < 512 && off >= 440 {
		return fmt.Sprintf("the remains of an MBR partition table (first non-zero byte at %s; its 0x55AA signature was erased)", at(off)), nil
	}
	if off%512 == 0 {
		if found, err := l.blkid(ctx, d.path, off); err == nil && found != "" {
			return fmt.Sprintf("%s at %s", found, at(off)), nil
		}
	}
	return fmt.Sprintf("unrecognised non-zero data at %s (perhaps an encrypted volume, a partition's remains or a format latchkey does not know)", at(off)), nil
}

// probeSpan covers every byte the signature table reads from a
// candidate (the btrfs magic at +65600).
const probeSpan = 65600 + 8

// bufView is the view of a candidate at base within buf.
func bufView(buf []byte, base int64) view {
	return func(o, n int64) []byte {
		a := base + o
		if o < 0 || a < 0 || a+n > int64(len(buf)) {
			return nil
		}
		return buf[a : a+n]
	}
}

// describeAt names a signature at c that explains the first non-zero
// byte at off.
func describeAt(what string, c, off int64) string {
	if c == off {
		return fmt.Sprintf("%s at %s", what, at(c))
	}
	return fmt.Sprintf("%s at %s (first non-zero byte at %s)", what, at(c), at(off))
}
