package load

import (
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"
)

// perJoin is the verifier's CPU per successful join of a phase.
func (w cpuWindow) perJoin(p *phase) time.Duration {
	if p == nil || len(p.lat) == 0 {
		return 0
	}
	return w.self / time.Duration(len(p.lat))
}

// p384 is the mean of the two bare measurements (before and after load).
func (r *result) p384PerOp() time.Duration {
	return (r.p384[0].perOp() + r.p384[1].perOp()) / 2
}

func (r *result) ratio() float64 {
	return float64(r.closedCPU.perJoin(r.closed)) / float64(r.p384PerOp())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *result) print(w io.Writer) {
	fmt.Fprintf(w, "\nSNP load: verifier as its own process (pid %d), %d concurrent agents, joins each on a new loopback TLS 1.3 connection with a freshly signed report, token minted in memory and acknowledged\n",
		r.pid, r.agents)
	fmt.Fprintf(w, "note: the load generator (agents, report signing, TLS clients) shares this machine's %d CPUs with the verifier, so joins/s and latencies include its contention; verifier CPU per join does not. load average before %s, after %s\n",
		runtime.NumCPU(), r.loadBefore, r.loadAfter)
	fmt.Fprintf(w, "%-18s %6s %6s %6s %8s %8s %8s %8s %8s %12s\n",
		"phase (joins)", "agents", "joins", "failed", "joins/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "verifier CPU")
	r.printPhase(w, r.warm, nil)
	r.printPhase(w, r.serial, nil)
	r.printPhase(w, r.closed, &r.closedCPU)
	for _, pr := range r.paced {
		r.printPhase(w, pr.joins, &pr.cpu)
	}
	r.printSummary(w)
	r.printPacedCost(w)
	r.printStorm(w)
}

func (r *result) printPhase(w io.Writer, p *phase, cpu *cpuWindow) {
	if p == nil {
		return
	}
	// Every row says "joins" so scripts/bench.sh's filter keeps it.
	name, per := p.name+" joins", "-"
	for _, pr := range r.paced {
		if p == pr.joins {
			name = fmt.Sprintf("paced joins %.0f/s", pr.rate)
		}
	}
	if cpu != nil {
		per = fmt.Sprintf("%.3f ms/join", ms(cpu.perJoin(p)))
	}
	fmt.Fprintf(w, "%-18s %6d %6d %6d %8.1f %8.2f %8.2f %8.2f %8.2f %12s\n", name, p.agents, len(p.lat), p.failed,
		p.rate(), ms(p.pct(0.50)), ms(p.pct(0.90)), ms(p.pct(0.99)), ms(p.pct(1)), per)
}

func (r *result) printSummary(w io.Writer) {
	a, b := r.p384[0], r.p384[1]
	fmt.Fprintf(w, "cpu: bare P-384 verify (ecdsa.VerifyASN1 of a report signature by the VCEK, one goroutine, thread CPU time) %.3f ms/op (before load %.3f over %d ops, after %.3f over %d ops; wall %.3f ms/op)\n",
		ms(r.p384PerOp()), ms(a.perOp()), a.ops, ms(b.perOp()), b.ops, ms((a.wallPerOp()+b.wallPerOp())/2))
	perJoin := r.closedCPU.perJoin(r.closed)
	fmt.Fprintf(w, "ratio: verifier CPU per join %.3f ms (closed loop, its own getrusage) / bare P-384 verify %.3f ms = %.2f (target <= %.1f: %s)\n",
		ms(perJoin), ms(r.p384PerOp()), r.ratio(), targetRatio, verdict(r.ratio()/targetRatio))
	l := r.p384Loaded
	fmt.Fprintf(w, "ratio: against the bare P-384 verify sampled during the closed loop (%.3f ms/op over %d ops, same contended cores and caches as the verifier): %.2f\n",
		ms(l.perOp()), l.ops, float64(perJoin)/float64(l.perOp()))
	fmt.Fprintf(w, "ratio: that is %.0f joins/s per dedicated core of this machine, %.0f on two\n",
		float64(time.Second)/float64(perJoin), 2*float64(time.Second)/float64(perJoin))
	r.printLatencyVerdict(w)
	fmt.Fprintf(w, "verifier rss: idle %.1f MiB before load, peak %.1f MiB (VmHWM and 50 ms samples)\n",
		float64(r.rssIdle)/1024, float64(r.rssPeak)/1024)
	r.printDetail(w)
}

func (r *result) printLatencyVerdict(w io.Writer) {
	c := r.closed
	floor := time.Duration(float64(r.agents) / c.rate() * float64(time.Second))
	fmt.Fprintf(w, "p99 at %d concurrent agents, closed loop: %.1f ms (target < %.0f ms: %s); Little's law puts the mean at agents/joins/s = %.1f ms whatever the verifier does\n",
		r.agents, ms(c.pct(0.99)), ms(targetP99), verdict(float64(c.pct(0.99))/float64(targetP99)), ms(floor))
	for _, pr := range r.paced {
		p := pr.joins
		fmt.Fprintf(w, "p99 at %d concurrent agents, paced at %.0f joins/s (open loop, latency from each join's scheduled start): %.1f ms (target < %.0f ms: %s)\n",
			r.agents, pr.rate, ms(p.pct(0.99)), ms(targetP99), verdict(float64(p.pct(0.99))/float64(targetP99)))
	}
}

// verdict says whether a figure/target quotient meets the target.
func verdict(q float64) string {
	if q <= 1 {
		return "met"
	}
	return fmt.Sprintf("missed by %.0f%%", (q-1)*100)
}

func (r *result) printDetail(w io.Writer) {
	c := r.closedCPU
	n := uint64(max(1, len(r.closed.lat)))
	fmt.Fprintf(w, "cpu: verifier per join (closed loop): kernel /proc view %.3f ms; %d allocations, %.1f KiB allocated, %d GC cycles in the phase; idle %.2f ms CPU per second\n",
		ms(c.proc/time.Duration(n)), (c.after.Mallocs-c.before.Mallocs)/n,
		float64(c.after.TotalAlloc-c.before.TotalAlloc)/float64(n)/1024, c.after.NumGC-c.before.NumGC,
		ms(r.idle.self)/r.idleWall.Seconds())
	fmt.Fprintf(w, "cpu: load generator per join (closed loop, this process, bare P-384 sampling excluded) %.3f ms: it takes %.0f%% of the CPU the verifier and it use\n",
		ms(r.generatorCPU/time.Duration(n)), 100*float64(r.generatorCPU)/float64(r.generatorCPU+c.self))
	fmt.Fprintf(w, "cpu: verifier whole life (kernel rusage at exit) %.2f s user+sys, max rss %.1f MiB\n",
		float64(r.rusage.Utime.Nano()+r.rusage.Stime.Nano())/1e9, float64(r.rusage.Maxrss)/1024)
	fmt.Fprintf(w, "joins: %d succeeded in all phases, tokens minted %d, revoked %d; agents retried %d attempts\n",
		r.joined(), r.final.Mints, r.final.Revokes, r.failedAttempts)
	if r.firstFailure != nil {
		fmt.Fprintf(w, "joins: first retried attempt: %v\n", r.firstFailure)
	}
}

func (r *result) joined() int64 {
	var n int
	for _, p := range r.phases() {
		n += len(p.lat)
	}
	if r.storm != nil {
		n += len(r.storm.joins.lat)
	}
	return int64(n)
}

// report gives `go test -bench` the headline figures.
func (r *result) report(b *testing.B) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(r.closedCPU.perJoin(r.closed))/1e3, "verifier-cpu-us/join")
	b.ReportMetric(float64(r.p384PerOp())/1e3, "p384-us/op")
	b.ReportMetric(r.ratio(), "ratio")
	b.ReportMetric(float64(r.closedCPU.perJoin(r.closed))/float64(r.p384Loaded.perOp()), "loaded-ratio")
	b.ReportMetric(r.closed.rate(), "joins/s")
	b.ReportMetric(ms(r.closed.pct(0.50)), "p50-ms")
	b.ReportMetric(ms(r.closed.pct(0.99)), "p99-ms")
	for i, pr := range r.paced {
		b.ReportMetric(ms(pr.joins.pct(0.99)), fmt.Sprintf("paced%d-p99-ms", i))
		b.ReportMetric(r.pacedRatio(pr), fmt.Sprintf("paced%d-cpu-ratio", i))
	}
	b.ReportMetric(float64(r.rssIdle)/1024, "rss-idle-MiB")
	b.ReportMetric(float64(r.rssPeak)/1024, "rss-peak-MiB")
}

// check fails the run when a join failed, or when the token step did not
// run exactly once per join with every ticket acknowledged.
func (r *result) check(b *testing.B) {
	for _, p := range r.phases() {
		if p.failed > 0 {
			b.Errorf("%s: %d of %d joins failed, first: %v", p.name, p.failed, p.joins, p.err)
		}
	}
	r.checkStorm(b)
	if r.final.Mints != r.joined() || r.final.Revokes != 0 {
		b.Errorf("verifier minted %d tokens and revoked %d for %d joins", r.final.Mints, r.final.Revokes, r.joined())
	}
}

// phases are the non-storm phases that ran.
func (r *result) phases() []*phase {
	var out []*phase
	for _, p := range []*phase{r.warm, r.serial, r.closed} {
		if p != nil {
			out = append(out, p)
		}
	}
	for _, pr := range r.paced {
		out = append(out, pr.joins)
	}
	return out
}

// pacedRatio is a paced phase's verifier CPU per join over the closed
// loop's.
func (r *result) pacedRatio(pr *pacedRun) float64 {
	return float64(pr.cpu.perJoin(pr.joins)) / float64(r.closedCPU.perJoin(r.closed))
}

// printPacedCost compares each paced phase's verifier CPU per join with
// the closed loop's, with what the runtime did per join in each (the
// causes an idle-time join pays for: GC cycles, context switches, i.e.
// threads put to sleep and woken, allocations, and the runtime's sysmon
// thread's CPU and runs: threads.go).
func (r *result) printPacedCost(w io.Writer) {
	fmt.Fprintf(w, "%-26s %8s %9s %8s %10s %10s %9s %9s %8s %10s %9s\n", "cpu per join (verifier)", "joins/s", "ms/join", "/closed",
		"/bare P384", "allocs", "KiB", "GC/1000", "ctxsw", "sysmon us", "sysmon sw")
	row := func(name string, rate float64, p *phase, c cpuWindow) {
		n := uint64(max(1, len(p.lat)))
		per := c.perJoin(p)
		fmt.Fprintf(w, "%-26s %8.1f %9.3f %8.2f %10.2f %10d %9.1f %9.2f %8.2f %10.1f %9.2f\n", name, rate, ms(per),
			float64(per)/float64(r.closedCPU.perJoin(r.closed)), float64(per)/float64(r.p384PerOp()),
			(c.after.Mallocs-c.before.Mallocs)/n, float64(c.after.TotalAlloc-c.before.TotalAlloc)/float64(n)/1024,
			1000*float64(c.after.NumGC-c.before.NumGC)/float64(n),
			float64(c.after.CtxSwitches-c.before.CtxSwitches)/float64(n),
			float64(c.after.SysmonCPU-c.before.SysmonCPU)/float64(n)/float64(time.Microsecond),
			float64(c.after.SysmonSwitches-c.before.SysmonSwitches)/float64(n))
	}
	row("closed loop", r.closed.rate(), r.closed, r.closedCPU)
	for _, pr := range r.paced {
		name := fmt.Sprintf("paced %.0f/s", pr.rate)
		if pr.fraction > 0 {
			name = fmt.Sprintf("paced %.0f%% (%.0f/s)", 100*pr.fraction, pr.rate)
		}
		row(name, pr.joins.rate(), pr.joins, pr.cpu)
	}
	for _, pr := range r.paced {
		q := r.pacedRatio(pr)
		fmt.Fprintf(w, "ratio: paced at %.0f joins/s, verifier CPU per join / closed loop's = %.2f (target <= %.1f: %s)\n",
			pr.rate, q, targetPacedRatio, verdict(q/targetPacedRatio))
	}
}
