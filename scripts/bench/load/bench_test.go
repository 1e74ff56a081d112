package load

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/internal/benchtest"
)

// envBench must be set for BenchmarkSNPLoad to run, so `go test -bench .
// ./...` does not start a verifier and a minute of load by accident.
const envBench = "LATCHKEY_LOAD_BENCH"

// The benchmark's targets (docs/benchmarks.md, "SEV-SNP under load").
const (
	targetRatio = 2.0
	// targetPacedRatio bounds a paced phase's verifier CPU per join over
	// the closed loop's.
	targetPacedRatio = 1.2
	targetP99        = 50 * time.Millisecond
)

var (
	flagAgents     = flag.Int("load.concurrency", 256, "concurrent agents (each join on its own TLS connection)")
	flagJoins      = flag.Int("load.joins", 6000, "joins in the measured closed-loop phase")
	flagWarmup     = flag.Int("load.warmup", 512, "joins before measuring")
	flagSerial     = flag.Int("load.serial", 100, "joins by a single agent after the warm-up: the latency floor (0: none)")
	flagPacedRate  = flag.Float64("load.paced-rate", 0, "joins/s of the paced phase (0: half the closed-loop rate; <0: no paced phase); ignored with -load.paced-fractions")
	flagPacedFracs = flag.String("load.paced-fractions", "", "comma-separated fractions of the closed-loop rate, one paced phase each (for example 0.1,0.5,1), every one -load.paced-time long with its own CPU window")
	flagPacedTime  = flag.Duration("load.paced-time", 15*time.Second, "length of the paced phase")
	flagP384Time   = flag.Duration("load.p384-time", time.Second, "CPU time of each bare P-384 measurement")
	flagCPUProfile = flag.String("load.cpuprofile", "", "write the verifier's CPU profile of the closed loop to this file (of a paced phase to FILE.paced, or FILE.paced-NNN for NNN % of capacity)")
	flagVerifEnv   = flag.String("load.verifier-env", "", "space-separated NAME=VALUE pairs for the verifier process only (for example GODEBUG=gctrace=1)")
	flagVerifLog   = flag.String("load.verifier-log", "", "write the verifier's stderr (audit log, and gctrace lines) to this file instead of the run's temporary directory")
	flagVerifSlack = flag.Duration("load.verifier-timerslack", 0, "start the verifier with this timer slack, as the unit's TimerSlackNSec= does (0: the kernel's default)")
	flagTimeout    = flag.Duration("load.timeout", 5*time.Minute, "bound on all joins together")
)

// BenchmarkSNPLoad is the SNP load benchmark (see the package doc). It runs
// once whatever b.N is (scripts/bench-load.sh passes -test.benchtime=1x);
// flags -load.* shape it. It fails when a join fails or a token was not
// minted and acknowledged; the targets are reported, never asserted.
func BenchmarkSNPLoad(b *testing.B) {
	if os.Getenv(envBench) == "" {
		b.Skip("set " + envBench + "=1 to run the load benchmark (scripts/bench-load.sh does)")
	}
	r := runLoad(b)
	r.print(os.Stdout)
	r.report(b)
	r.check(b)
}

// cpuWindow is the verifier's CPU over one phase, as it reports it
// (getrusage) and as the kernel's /proc shows it.
type cpuWindow struct {
	self, proc time.Duration
	before     verifierStats
	after      verifierStats
}

// result is everything one run measured.
type result struct {
	agents, pid int
	// Phases: warm-up, one agent alone (latency floor), closed loop
	// (throughput, the headline CPU), paced (open-loop latency).
	warm, serial, closed *phase
	// paced are the paced phases in the order run (one, or one per
	// -load.paced-fractions entry).
	paced []*pacedRun
	// storm is the open-loop phase at -load.storm-factor times the
	// closed-loop rate (storm_test.go).
	storm          *stormResult
	failedAttempts int64
	firstFailure   error // the first retried attempt's cause, if any
	// The verifier's CPU over the closed loop and idle (during the first
	// bare P-384 measurement, idleWall long).
	closedCPU, idle cpuWindow
	idleWall        time.Duration
	// generatorCPU is this process's CPU over the closed loop.
	generatorCPU time.Duration
	// p384 is measured before and after the load, p384Loaded during the
	// closed loop.
	p384             [2]p384Result
	p384Loaded       p384Result
	rssIdle, rssPeak int64 // KiB
	final            verifierStats
	rusage           *syscall.Rusage
	loadBefore       string
	loadAfter        string
}

func runLoad(b *testing.B) *result {
	s := snptest.New(b)
	dir := b.TempDir()
	v := startVerifier(b, dir, writeVerifierFiles(b, dir, s))
	r := &result{agents: *flagAgents, pid: v.cmd.Process.Pid, loadBefore: loadAvg()}
	in := newP384Input(b, s)
	r.rssIdle, _ = mustMem(b, r.pid)
	t0 := time.Now()
	r.idle = measureCPU(b, v, func() { r.p384[0] = measureP384(b, in, *flagP384Time) })
	r.idleWall = time.Since(t0)
	f := newFleet(b, s, v.addr, v.pin, *flagAgents)
	ctx, cancel := context.WithTimeout(context.Background(), *flagTimeout)
	defer cancel()
	stopSampler := sampleRSS(r.pid)
	r.warm = f.closedLoop(ctx, "warm-up", *flagAgents, *flagWarmup)
	if *flagSerial > 0 {
		r.serial = f.closedLoop(ctx, "one-agent", 1, *flagSerial)
	}
	gen0 := benchtest.SelfCPU(b)
	r.closedCPU = measureCPU(b, v, func() {
		defer profile(b, v, "")()
		stop := make(chan struct{})
		loaded := sampleP384(in, stop)
		r.closed = f.closedLoop(ctx, "closed-loop", *flagAgents, *flagJoins)
		close(stop)
		r.p384Loaded = <-loaded
	})
	r.generatorCPU = benchtest.SelfCPU(b) - gen0 - r.p384Loaded.cpu
	r.runPaced(ctx, b, v, f)
	r.runStorm(ctx, b, v, f)
	r.failedAttempts = f.failedAttempts.Load()
	r.firstFailure = f.firstFailure.Err()
	r.p384[1] = measureP384(b, in, *flagP384Time)
	r.rssPeak = stopSampler()
	_, hwm := mustMem(b, r.pid)
	r.rssPeak = max(r.rssPeak, hwm)
	r.loadAfter = loadAvg()
	r.final, r.rusage = v.stop(b)
	return r
}

// pacedRun is one paced phase: its rate, as a fraction of the closed
// loop's when it was asked for that way (0 otherwise), and the verifier's
// CPU over it.
type pacedRun struct {
	rate, fraction float64
	joins          *phase
	cpu            cpuWindow
}

func (r *result) runPaced(ctx context.Context, b *testing.B, v *verifierProc, f *fleet) {
	fracs, err := parseFractions(*flagPacedFracs)
	if err != nil {
		b.Fatal(err)
	}
	if len(fracs) == 0 {
		rate := *flagPacedRate
		if rate < 0 {
			return
		}
		if rate == 0 {
			rate = r.closed.rate() / 2
		}
		r.paced = append(r.paced, r.runPacedAt(ctx, b, v, f, rate, 0, ".paced"))
		return
	}
	for _, q := range fracs {
		suffix := fmt.Sprintf(".paced-%03.0f", q*100)
		r.paced = append(r.paced, r.runPacedAt(ctx, b, v, f, q*r.closed.rate(), q, suffix))
	}
}

func (r *result) runPacedAt(ctx context.Context, b *testing.B, v *verifierProc, f *fleet, rate, fraction float64, suffix string) *pacedRun {
	pr := &pacedRun{rate: rate, fraction: fraction}
	n := max(1, int(rate*flagPacedTime.Seconds()))
	pr.cpu = measureCPU(b, v, func() {
		defer profile(b, v, suffix)()
		pr.joins = f.paced(ctx, "paced", n, rate)
	})
	return pr
}

// parseFractions reads -load.paced-fractions: positive numbers up to 2.
func parseFractions(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		q, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || q <= 0 || q > 2 {
			return nil, fmt.Errorf("-load.paced-fractions: %q is not a fraction in (0, 2]", f)
		}
		out = append(out, q)
	}
	return out, nil
}

// measureCPU runs fn and returns the verifier's CPU meanwhile.
func measureCPU(b *testing.B, v *verifierProc, fn func()) cpuWindow {
	b.Helper()
	w := cpuWindow{before: v.stats(b)}
	p0, err := benchtest.ProcessCPU(v.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	fn()
	w.after = v.stats(b)
	p1, err := benchtest.ProcessCPU(v.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	w.self, w.proc = w.after.CPU-w.before.CPU, p1-p0
	return w
}

// profile starts the verifier's CPU profile when -load.cpuprofile asks for
// one (the closed loop's in that file, each paced phase's in that file
// with suffix appended) and returns what stops it.
func profile(b *testing.B, v *verifierProc, suffix string) func() {
	if *flagCPUProfile == "" {
		return func() {}
	}
	path, err := filepath.Abs(*flagCPUProfile + suffix)
	if err != nil {
		b.Fatal(err)
	}
	v.profile(b, "profile-start "+path)
	return func() { v.profile(b, "profile-stop") }
}

func mustMem(b *testing.B, pid int) (rss, hwm int64) {
	b.Helper()
	rss, hwm, err := procMemKiB(pid)
	if err != nil {
		b.Fatal(err)
	}
	return rss, hwm
}

// sampleRSS polls the verifier's VmRSS every 50 ms until the returned
// function is called, which returns the largest value seen (KiB).
func sampleRSS(pid int) func() int64 {
	var mu sync.Mutex
	var peak int64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, _, err := procMemKiB(pid); err == nil {
				mu.Lock()
				peak = max(peak, rss)
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		<-stopped
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
