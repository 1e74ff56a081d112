package load

// The boot storm: joins arrive open-loop at a multiple
// of the measured closed-loop capacity, each a fresh node with its own
// ticket client, every one kept until it joins or its 2-minute timeout
// passes. The verifier's admission control answers the excess with
// RESOURCE_EXHAUSTED and a retry-after hint; the agents wait the hint
// (with jitter) and come back. Reported: joins admitted and failed, join
// latency from the scheduled arrival, the latency of the admitted attempt
// alone (from its dial to the ticket: what the verifier's queueing would
// inflate), hints honoured and any retry earlier than its hint, the
// verifier's RSS peak.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/benchtest"
)

var (
	flagStormFactor = flag.Float64("load.storm-factor", 3, "offered load of the storm phase, times the closed-loop rate (0: no storm)")
	flagStormTime   = flag.Duration("load.storm-time", 10*time.Second, "arrival window of the storm phase")
	flagMaxInFlight = flag.Int("load.max-in-flight", 0, "the verifier's limits.maxJoinsInFlight (0: its default, 8 x GOMAXPROCS)")
)

type stormResult struct {
	rate                float64
	offered             int
	joins               *phase          // latency from the scheduled arrival
	admitted            []time.Duration // the admitted attempt's latency, sorted
	hints, early, fails int64
	attempts            int64
	hintTotal           time.Duration
	rssPeak             int64 // KiB
	cpu                 cpuWindow
	firstFail           benchtest.FirstError
}

func (r *result) runStorm(ctx context.Context, b *testing.B, v *verifierProc, f *fleet) {
	if *flagStormFactor <= 0 {
		return
	}
	rate := *flagStormFactor * r.closed.rate()
	n := max(1, int(rate*flagStormTime.Seconds()))
	st := &stormResult{rate: rate, offered: n}
	stop := sampleRSS(r.pid)
	st.cpu = measureCPU(b, v, func() { f.storm(ctx, st, n, rate) })
	st.rssPeak = stop()
	r.storm = st
}

// stormJoin is one node of the storm.
type stormJoin struct {
	mu       sync.Mutex
	attempt  time.Time // start of the latest attempt
	hintedAt time.Time // when the latest hint was received
	hint     time.Duration
}

func (f *fleet) storm(ctx context.Context, st *stormResult, n int, rate float64) {
	rec := &recorder{lat: make([]time.Duration, 0, n)}
	var admittedMu sync.Mutex
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var hints, early, fails, attempts atomic.Int64
	var hintNs atomic.Int64
	due := make(chan time.Time, n)
	start := time.Now()
	go schedule(ctx, due, start, n, rate)
	var wg sync.WaitGroup
	i := 0
	for at := range due {
		iss := f.issuers[i%len(f.issuers)]
		i++
		wg.Go(func() {
			j := &stormJoin{}
			c, err := ticket.New(ticket.Config{
				Endpoints: []string{f.addr}, Pins: []atls.Pin{f.pin}, Issuer: iss,
				Timeout: 2 * time.Minute, AttemptTimeout: time.Minute,
				InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, RefusalBackoff: time.Second,
				Logger: quiet,
				OnAttempt: func(string, int) {
					attempts.Add(1)
					j.mu.Lock()
					defer j.mu.Unlock()
					now := time.Now()
					if !j.hintedAt.IsZero() && now.Sub(j.hintedAt) < j.hint {
						early.Add(1)
					}
					j.attempt = now
				},
				OnBusy: func(d time.Duration) {
					hints.Add(1)
					hintNs.Add(int64(d))
					j.mu.Lock()
					j.hintedAt, j.hint = time.Now(), d
					j.mu.Unlock()
				},
				OnAttemptFailed: func(err error) {
					fails.Add(1)
					st.firstFail.Set(err)
				},
			})
			if err != nil {
				rec.add(0, err)
				return
			}
			err = f.join(ctx, c)
			rec.add(time.Since(at), err)
			if err == nil {
				j.mu.Lock()
				d := time.Since(j.attempt)
				j.mu.Unlock()
				admittedMu.Lock()
				st.admitted = append(st.admitted, d)
				admittedMu.Unlock()
			}
		})
	}
	wg.Wait()
	st.joins = rec.phase("storm", n, n, time.Since(start))
	slices.Sort(st.admitted)
	st.hints, st.early, st.fails, st.attempts = hints.Load(), early.Load(), fails.Load(), attempts.Load()
	st.hintTotal = time.Duration(hintNs.Load())
}

func (r *result) printStorm(w io.Writer) {
	st := r.storm
	if st == nil {
		return
	}
	p := st.joins
	fmt.Fprintf(w, "\nstorm: %.1fx the closed-loop rate = %.0f joins/s offered for %s (%d joins), each a new node with its own client\n",
		*flagStormFactor, st.rate, *flagStormTime, st.offered)
	fmt.Fprintf(w, "storm: %d admitted and joined, %d failed; done in %.1f s (%.0f joins/s served)\n",
		len(p.lat), p.failed, p.wall.Seconds(), p.rate())
	fmt.Fprintf(w, "storm: join latency from arrival p50 %.0f ms p99 %.0f ms max %.0f ms\n",
		ms(p.pct(0.5)), ms(p.pct(0.99)), ms(p.pct(1)))
	base := "n/a"
	if r.serial != nil {
		base = fmt.Sprintf("%.1f ms (ratio %.2f)", ms(r.serial.pct(0.99)), float64(benchtest.Quantile(st.admitted, 0.99))/float64(r.serial.pct(0.99)))
	}
	fmt.Fprintf(w, "storm: verifier's validation of the %d accepted joins p50 %.2f ms p99 %.2f ms; closed loop (%d joins) p50 %.2f ms p99 %.2f ms (p99 ratio storm/closed %.2f)\n",
		st.cpu.after.Validations, st.cpu.after.ValidationP50Ms, st.cpu.after.ValidationP99Ms,
		r.closedCPU.after.Validations, r.closedCPU.after.ValidationP50Ms, r.closedCPU.after.ValidationP99Ms,
		st.cpu.after.ValidationP99Ms/r.closedCPU.after.ValidationP99Ms)
	fmt.Fprintf(w, "storm: admitted attempt alone (dial to ticket) p50 %.1f ms p99 %.1f ms; one-agent p99 %s\n",
		ms(benchtest.Quantile(st.admitted, 0.5)), ms(benchtest.Quantile(st.admitted, 0.99)), base)
	mean := time.Duration(0)
	if st.hints > 0 {
		mean = st.hintTotal / time.Duration(st.hints)
	}
	fmt.Fprintf(w, "storm: %d attempts, %d retry-after hints honoured (mean hint %.0f ms), %d retries earlier than their hint, %d failed attempts\n",
		st.attempts, st.hints, ms(mean), st.early, st.fails)
	if e := st.firstFail.Err(); e != nil {
		fmt.Fprintf(w, "storm: first failed attempt (retried): %v\n", e)
	}
	fmt.Fprintf(w, "storm: verifier cpu %.2f s, %.0f us per admitted join; rss peak %.1f MiB (idle %.1f MiB)\n",
		st.cpu.self.Seconds(), float64(st.cpu.self.Microseconds())/float64(max(1, len(p.lat))), float64(st.rssPeak)/1024, float64(r.rssIdle)/1024)
}

func (r *result) checkStorm(b *testing.B) {
	st := r.storm
	if st == nil {
		return
	}
	if st.joins.failed > 0 {
		b.Errorf("storm: %d of %d joins failed, first: %v", st.joins.failed, st.offered, st.joins.err)
	}
	if st.early > 0 {
		b.Errorf("storm: %d retries came before their hint", st.early)
	}
	if errors.Is(st.joins.err, context.DeadlineExceeded) {
		b.Errorf("storm: a join timed out")
	}
}
