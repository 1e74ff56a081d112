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

	"github.com/anatol/luks.go"
	"golang.org/x/sys/unix"

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
	pbkdf2Img := imageFile(b, formatArgs(fixtureUUID, "")[:len(formatArgs(fixtureUUID, ""))-1]...)
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
// device, alternated in the same run (dd, check, dd, check, ...) so both
// see the same machine load and the same state of the backing file's
// page cache. Reports each one's rate, their ratio (target ≥ 0.9) and
// the agent's CPU time per GiB (target ≤ 0.1 s; getrusage of this
// process only: dd is a child, the loop device's reads run in a kernel
// worker). LATCHKEY_FULLCHECK_GIB (default "1,10,100") and
// LATCHKEY_FULLCHECK_ROUNDS (default 3) choose the sizes and pairs.
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
	rounds := 3
	if v := os.Getenv("LATCHKEY_FULLCHECK_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	for _, gib := range sizes {
		b.Run(fmt.Sprintf("%dGiB", gib), func(b *testing.B) {
			r := newRig(b, gib<<30)
			l := r.stage(func(c *LUKSConfig) { c.Logger = slog.New(slog.DiscardHandler) })
			d, err := openDevice(r.dev, readOnly)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			var ddWall, checkWall, checkCPU time.Duration
			for b.Loop() {
				for range rounds {
					start := time.Now()
					run(b, nil, "dd", "if="+r.dev, "of=/dev/null", "bs=4M", "iflag=direct", "status=none")
					dd := time.Since(start)
					cpu0 := selfCPU()
					start = time.Now()
					off, err := l.fullCheck(context.Background(), d, 0)
					wall := time.Since(start)
					cpu := selfCPU() - cpu0
					if err != nil || off != -1 {
						b.Fatalf("full check: %d, %v", off, err)
					}
					ddWall, checkWall, checkCPU = ddWall+dd, checkWall+wall, checkCPU+cpu
					b.Logf("pair: dd %.0f MB/s, check %.0f MB/s, ratio %.2f, check CPU %.3f s/GiB",
						mbs(gib, dd), mbs(gib, wall), dd.Seconds()/wall.Seconds(), cpu.Seconds()/float64(gib))
				}
			}
			b.ReportMetric(float64(b.N*rounds)*float64(gib<<30)/checkWall.Seconds()/1e6, "check-MB/s")
			b.ReportMetric(float64(b.N*rounds)*float64(gib<<30)/ddWall.Seconds()/1e6, "dd-MB/s")
			b.ReportMetric(ddWall.Seconds()/checkWall.Seconds(), "check/dd")
			b.ReportMetric(checkCPU.Seconds()/float64(int64(b.N*rounds)*gib), "cpu-s/GiB")
		})
	}
}

func mbs(gib int64, took time.Duration) float64 { return float64(gib<<30) / took.Seconds() / 1e6 }

func selfCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
