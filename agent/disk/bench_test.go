package disk

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/anatol/luks.go"
	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
)

// Benchmarks for docs/benchmarks.md:
//
//	go test ./agent/disk -run '^$' -bench . -benchmem -benchtime 3x
//
// BenchmarkUnseal compares luks.go with `cryptsetup open
// --test-passphrase` on latchkey's pbkdf2-1000 header and on a header
// with cryptsetup's defaults (argon2id, benchmarked to ~2 s). BenchmarkDiskStep
// is the agent's own per-boot work: read and validate the header from a
// loop device and unseal it from the detached copy (target < 50 ms).

func imageFile(b *testing.B, args ...string) string {
	b.Helper()
	img := filepath.Join(b.TempDir(), "hdr.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(img, imageSize); err != nil {
		b.Fatal(err)
	}
	run(b, testKey(41), "cryptsetup", append(args, img)...)
	return img
}

func BenchmarkUnseal(b *testing.B) {
	if _, err := realRunner.Run(context.Background(), execx.Cmd{Name: "cryptsetup", Args: []string{"--version"}}); err != nil {
		b.Skip("needs cryptsetup")
	}
	key := testKey(41)
	pbkdf2Img := imageFile(b, luks2.FormatArgs(fixtureUUID, "")[:len(luks2.FormatArgs(fixtureUUID, ""))-1]...)
	argonImg := imageFile(b, "luksFormat", "--batch-mode", "--type", "luks2", "--key-file", "-")
	for _, c := range []struct{ name, img string }{{"pbkdf2-1000", pbkdf2Img}, {"argon2id-default", argonImg}} {
		b.Run("luks.go/"+c.name, func(b *testing.B) {
			defer reportCPU(b)()
			for b.Loop() {
				d, err := luks.Open(c.img)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := d.UnsealVolume(0, key); err != nil {
					b.Fatal(err)
				}
				d.Close()
			}
		})
		b.Run("cryptsetup-test-passphrase/"+c.name, func(b *testing.B) {
			defer reportCPU(b)()
			for b.Loop() {
				_, err := realRunner.Run(context.Background(), execx.Cmd{Name: "cryptsetup",
					Args: []string{"open", "--test-passphrase", "--key-file", "-", c.img}, Stdin: bytes.NewReader(key)})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDiskStep(b *testing.B) {
	r := newRig(b, testDiskSize)
	key := testKey(42)
	r.mustBoot(r.stage(nil), key)
	r.kernel.powerOff()
	l := r.stage(nil)
	ctx := context.Background()
	b.Run("read+validate+unseal", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			dropCache(b, r.dev)
			d, p, err := l.openAndClassifyMode(ctx, readOnly)
			if err != nil || p.kind != kindOurs {
				b.Fatalf("classify: %v, %v", p.kind, err)
			}
			if _, err := unsealDetached(p.head, key, d.devno(), d.size); err != nil {
				b.Fatal(err)
			}
			d.Close()
		}
	})
	b.Run("prepare", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			dropCache(b, r.dev)
			if _, err := l.Prepare(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// dropCache empties the loop device's buffer cache, so each iteration
// reads the header from the device again.
func dropCache(b *testing.B, dev string) {
	f, err := os.Open(dev)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0); err != nil {
		b.Fatal(err)
	}
}

// reportCPU adds cpu-ms/op: CPU time of this process and its children
// (cryptsetup) per iteration. On a shared, loaded machine wall time
// mostly measures the queue for a core; CPU time measures the work.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64(cpuTime()-start)/1e6/float64(b.N), "cpu-ms/op")
	}
}

func cpuTime() int64 {
	var self, children unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	unix.Getrusage(unix.RUSAGE_CHILDREN, &children)
	ns := func(tv unix.Timeval) int64 { return tv.Nano() }
	return ns(self.Utime) + ns(self.Stime) + ns(children.Utime) + ns(children.Stime)
}

// BenchmarkBlankCheck is the first boot's blank-device check (scan.go)
// on sparse loop devices of 1, 10 and 100 GiB: the full reads of the
// first 16 MiB and last 4 MiB, and the probe windows at every 1 MiB
// (target: under 2 s at 100 GiB). Every iteration gets a fresh sparse
// file and loop device (made with the timer stopped), so nothing is in
// any cache, as on a first boot. The -dio variant uses a loop device in
// direct-I/O mode (losetup --direct-io=on), which, like a real disk, puts
// no host page cache under the reads; the -pread variant turns Linux AIO
// off to measure the fallback.
func BenchmarkBlankCheck(b *testing.B) {
	requireRoot(b)
	for _, c := range []struct {
		gib        int64
		dio, pread bool
	}{{1, false, false}, {10, false, false}, {100, false, false}, {100, true, false}, {100, false, true}} {
		name := fmt.Sprintf("%dGiB", c.gib)
		if c.dio {
			name += "-dio"
		}
		if c.pread {
			name += "-pread"
		}
		b.Run(name, func(b *testing.B) {
			useAIO = !c.pread
			defer func() { useAIO = true }()
			defer reportCPU(b)()
			for b.Loop() {
				b.StopTimer()
				dev := newLoop(b, c.gib<<30)
				if c.dio {
					run(b, nil, "losetup", "--direct-io=on", dev)
				}
				d, err := openDevice(dev, readOnly)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				res, err := scanDevice(context.Background(), d, 0)
				d.Close() // the loop device is detached at cleanup
				if err != nil || !res.blank() || res.candidates != c.gib<<10 {
					b.Fatalf("scan: %+v, %v", res, err)
				}
			}
		})
	}
}

// BenchmarkFullCheck is the default blank check (fullcheck.go: every
// byte read with O_DIRECT, 4 MiB requests, 4 in flight) next to
// `dd if=DEV of=/dev/null bs=4M iflag=direct` on the same sparse loop
// device, in the same run: one untimed dd first (a buffered loop device
// fills the backing file's page cache on its first read), then pairs
// whose order alternates (dd first, then the check first), so both see
// the same load and cache state. Reports each one's rate, their ratio
// (target ≥ 0.9) and the agent's CPU time per GiB (target ≤ 0.1 s;
// getrusage of this process only: dd is a child, and a loop device's
// reads run in a kernel worker). The -dio variants put the loop device in
// direct-I/O mode (no host page cache under it, like a real disk).
// LATCHKEY_FULLCHECK_GIB (default "1,10,100"), LATCHKEY_FULLCHECK_ROUNDS
// (pairs, default 2) and LATCHKEY_FULLCHECK_DIO ("0", "1" or default
// both) choose the runs.
func BenchmarkFullCheck(b *testing.B) {
	requireRoot(b)
	sizes := []int64{1, 10, 100}
	if v := os.Getenv("LATCHKEY_FULLCHECK_GIB"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			sizes = append(sizes, n)
		}
	}
	rounds := 2
	if v := os.Getenv("LATCHKEY_FULLCHECK_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	dios := []bool{false, true}
	switch os.Getenv("LATCHKEY_FULLCHECK_DIO") {
	case "0":
		dios = []bool{false}
	case "1":
		dios = []bool{true}
	}
	defer fullCheckShape(b)()
	for _, dio := range dios {
		for _, gib := range sizes {
			name := fmt.Sprintf("%dGiB", gib)
			if dio {
				name += "-dio"
			}
			b.Run(name, func(b *testing.B) { benchFullCheck(b, gib, rounds, dio) })
		}
	}
}

// BenchmarkFullCheckThrottled is BenchmarkFullCheck on a 1 GiB sparse
// loop device whose reads are throttled, for this process and its
// children, to a cloud disk's provisioned throughput (cgroup v1 blkio
// read_bps_device; LATCHKEY_FULLCHECK_MBS, default "125,250,1000" MB/s):
// there the device, not the CPU, sets the pace, as on a real first boot.
// The cgroup is made for the run and removed after it.
func BenchmarkFullCheckThrottled(b *testing.B) {
	requireRoot(b)
	rates := []int64{125, 250, 1000}
	if v := os.Getenv("LATCHKEY_FULLCHECK_MBS"); v != "" {
		rates = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			rates = append(rates, n)
		}
	}
	defer fullCheckShape(b)()
	for _, mbs := range rates {
		b.Run(fmt.Sprintf("%dMBps", mbs), func(b *testing.B) {
			benchFullCheckOn(b, 1, 2, false, mbs*1000*1000)
		})
	}
}

// fullCheckShape sets the full check's request size and depth from
// LATCHKEY_FULLCHECK_CHUNK_KIB and LATCHKEY_FULLCHECK_DEPTH (to compare
// shapes in one run), LATCHKEY_FULLCHECK_PREAD=1 (the blocking-pread
// fallback) and LATCHKEY_FULLCHECK_WAIT=syscall (AIO's blocking wait in
// io_getevents, as before the eventfd wait), and returns the undo.
func fullCheckShape(b *testing.B) func() {
	chunk, depth, aio, polled := fullCheckChunk, fullCheckDepth, useAIO, fullCheckPolledWait
	if v := os.Getenv("LATCHKEY_FULLCHECK_CHUNK_KIB"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n%4 != 0 {
			b.Fatalf("LATCHKEY_FULLCHECK_CHUNK_KIB=%q: want a positive multiple of 4", v)
		}
		fullCheckChunk = n << 10
	}
	if v := os.Getenv("LATCHKEY_FULLCHECK_DEPTH"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("LATCHKEY_FULLCHECK_DEPTH=%q: want a positive number", v)
		}
		fullCheckDepth = n
	}
	useAIO = os.Getenv("LATCHKEY_FULLCHECK_PREAD") != "1"
	switch v := os.Getenv("LATCHKEY_FULLCHECK_WAIT"); v {
	case "", "poll":
		fullCheckPolledWait = true
	case "syscall":
		fullCheckPolledWait = false
	default:
		b.Fatalf("LATCHKEY_FULLCHECK_WAIT=%q: want poll or syscall", v)
	}
	b.Logf("requests of %d KiB, %d in flight, AIO %v, polled wait %v", fullCheckChunk>>10, fullCheckDepth, useAIO, fullCheckPolledWait)
	return func() { fullCheckChunk, fullCheckDepth, useAIO, fullCheckPolledWait = chunk, depth, aio, polled }
}

// throttle puts this process in a new blkio cgroup limiting reads of dev
// to bps, and returns the undo.
func throttle(b *testing.B, dev string, bps int64) func() {
	root := "/sys/fs/cgroup/blkio"
	if _, err := os.Stat(filepath.Join(root, "blkio.throttle.read_bps_device")); err != nil {
		b.Skip("no cgroup v1 blkio throttling here")
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(root, fmt.Sprintf("latchkey-bench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	write := func(file, v string) {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
			b.Fatalf("%s: %v", file, err)
		}
	}
	write("blkio.throttle.read_bps_device", fmt.Sprintf("%d:%d %d", unix.Major(st.Rdev), unix.Minor(st.Rdev), bps))
	write("cgroup.procs", fmt.Sprint(os.Getpid()))
	return func() {
		if err := os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			b.Errorf("leave the cgroup: %v", err)
		}
		if err := os.Remove(dir); err != nil {
			b.Errorf("remove the cgroup: %v", err)
		}
	}
}

func benchFullCheck(b *testing.B, gib int64, rounds int, dio bool) {
	benchFullCheckOn(b, gib, rounds, dio, 0)
}

func benchFullCheckOn(b *testing.B, gib int64, rounds int, dio bool, bps int64) {
	r := newRig(b, gib<<30)
	if dio {
		run(b, nil, "losetup", "--direct-io=on", r.dev)
	}
	if bps > 0 {
		defer throttle(b, r.dev, bps)()
	}
	l := r.stage(func(c *LUKSConfig) { c.Logger = slog.New(slog.DiscardHandler) })
	d, err := openDevice(r.dev, readOnly)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var ddCPU time.Duration
	dd := func() time.Duration {
		cpu0, start := childrenCPU(), time.Now()
		run(b, nil, "dd", "if="+r.dev, "of=/dev/null", "bs=4M", "iflag=direct", "status=none")
		ddCPU += childrenCPU() - cpu0
		return time.Since(start)
	}
	var monCPU time.Duration
	var monRuns int64
	check := func() (time.Duration, time.Duration) {
		mon0, runs0 := monitorCPU(b)
		cpu0, start := selfCPU(), time.Now()
		off, err := l.fullCheck(context.Background(), d, 0)
		wall, cpu := time.Since(start), selfCPU()-cpu0
		mon1, runs1 := monitorCPU(b)
		monCPU, monRuns = monCPU+mon1-mon0, monRuns+runs1-runs0
		if err != nil || off != -1 {
			b.Fatalf("full check: %d, %v", off, err)
		}
		return wall, cpu
	}
	var ddWall, checkWall, checkCPU time.Duration
	for b.Loop() {
		dd() // warm-up, untimed
		ddCPU = 0
		for i := range rounds {
			var d1, w, c time.Duration
			mon0, runs0 := monCPU, monRuns
			if i%2 == 0 {
				d1 = dd()
				w, c = check()
			} else {
				w, c = check()
				d1 = dd()
			}
			ddWall, checkWall, checkCPU = ddWall+d1, checkWall+w, checkCPU+c
			b.Logf("pair %d: dd %.0f MB/s, check %.0f MB/s, check/dd %.2f, check CPU %.3f s/GiB (sysmon %.3f s/GiB, %.0f wake-ups/s)",
				i, mbs(gib, d1), mbs(gib, w), d1.Seconds()/w.Seconds(), c.Seconds()/float64(gib),
				(monCPU-mon0).Seconds()/float64(gib), float64(monRuns-runs0)/w.Seconds())
		}
	}
	n := float64(b.N * rounds)
	b.ReportMetric(n*float64(gib<<30)/checkWall.Seconds()/1e6, "check-MB/s")
	b.ReportMetric(n*float64(gib<<30)/ddWall.Seconds()/1e6, "dd-MB/s")
	b.ReportMetric(ddWall.Seconds()/checkWall.Seconds(), "check/dd")
	b.ReportMetric(checkCPU.Seconds()/n/float64(gib), "cpu-s/GiB")
	b.ReportMetric(ddCPU.Seconds()/n/float64(gib), "dd-cpu-s/GiB")
	b.ReportMetric(monCPU.Seconds()/n/float64(gib), "sysmon-cpu-s/GiB")
}

// monitorCPU is the CPU time so far of the Go runtime's monitor thread
// (sysmon) and the times it ran, from /proc/self/task/TID/schedstat: the
// runtime starts it first, so it is the thread with the lowest ID after
// the main thread's (thread IDs grow until the kernel's pid_max wraps
// them).
func monitorCPU(b *testing.B) (time.Duration, int64) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		b.Fatal(err)
	}
	pid, mon := os.Getpid(), 0
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil && tid > pid && (mon == 0 || tid < mon) {
			mon = tid
		}
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", mon))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw))
	ns, err1 := strconv.ParseInt(f[0], 10, 64)
	runs, err2 := strconv.ParseInt(f[len(f)-1], 10, 64)
	if len(f) != 3 || err1 != nil || err2 != nil {
		b.Fatalf("schedstat of thread %d: %q", mon, raw)
	}
	return time.Duration(ns), runs
}

func mbs(gib int64, took time.Duration) float64 { return float64(gib<<30) / took.Seconds() / 1e6 }

func childrenCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func selfCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkZeroTest is the full check's zero test alone (no I/O), on a
// buffer that fits in a core's cache, on one request's 4 MiB (in the
// shared cache, as data the loop driver just wrote) and on one that fits
// in no cache (as data written by a device's DMA may be): bytes per second = the
// cost per GiB of the check's CPU. The other variants are the
// candidates it was measured against: an OR over eight 64-bit words at a
// time, bytes.Count of zero bytes, bytes.Equal against a zero block.
func BenchmarkZeroTest(b *testing.B) {
	for _, n := range []int{256 << 10, 4 << 20, 64 << 20} {
		for _, f := range []struct {
			name string
			test func([]byte) int
		}{{"equal", firstNonZeroFast}, {"words", firstNonZeroWords}, {"count", firstNonZeroCount}, {"zeroblock", firstNonZeroBlock}} {
			b.Run(fmt.Sprintf("%dKiB/%s", n>>10, f.name), func(b *testing.B) {
				buf := alignedBuffer(int64(n))
				b.SetBytes(int64(n))
				for b.Loop() {
					if f.test(buf) >= 0 {
						b.Fatal("non-zero")
					}
				}
			})
		}
	}
}

// firstNonZeroWords ORs eight 64-bit words at a time (b's length a
// multiple of 64, as the benchmark's buffers are).
// firstNonZeroCount: bytes.Count of zero bytes (the runtime's
// vectorised count), a candidate.
func firstNonZeroCount(b []byte) int {
	if bytes.Count(b, []byte{0}) == len(b) {
		return -1
	}
	return firstNonZero(b)
}

var zeroBlock [64 << 10]byte

// firstNonZeroBlock: bytes.Equal against a zero block kept in the cache,
// a candidate.
func firstNonZeroBlock(b []byte) int {
	for i := 0; i < len(b); i += len(zeroBlock) {
		p := b[i:min(i+len(zeroBlock), len(b))]
		if !bytes.Equal(p, zeroBlock[:len(p)]) {
			return firstNonZero(b)
		}
	}
	return -1
}

func firstNonZeroWords(b []byte) int {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	for i := 0; i+8 <= len(w); i += 8 {
		if w[i]|w[i+1]|w[i+2]|w[i+3]|w[i+4]|w[i+5]|w[i+6]|w[i+7] != 0 {
			return firstNonZero(b)
		}
	}
	return -1
}

// openAndClassifyMode opens the disk and classifies what it holds, the
// first step of every boot, for the benchmarks.
func (l *LUKS) openAndClassifyMode(ctx context.Context, mode int) (*device, probe, error) {
	path, err := l.waitForDevice(ctx)
	if err != nil {
		return nil, probe{}, err
	}
	d, err := openDevice(path, mode)
	if err != nil {
		return nil, probe{}, err
	}
	p, err := l.classify(ctx, d, false)
	if err != nil {
		d.Close()
		return nil, probe{}, err
	}
	return d, p, nil
}
