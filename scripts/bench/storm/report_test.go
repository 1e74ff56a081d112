package storm

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/benchtest"
	"github.com/latchkey/latchkey/internal/k8stest"
)

// result is everything one storm measured.
type result struct {
	agents, snp, tpm int
	joins            []joined
	failed           int
	firstErr         error
	retried          atomic.Int64
	wall             time.Duration

	verifierCPU, generatorCPU time.Duration
	controlPlaneCPU           map[string]time.Duration
	verifierTotal             time.Duration
	verifierRSSKiB            int64

	tokensBefore, tokensAtEnd, tokensLeft int
	// tokensZero is how long after the last join the tokens fell back to
	// tokensBefore (-1: not within -storm.reap-wait).
	tokensZero time.Duration
	tokenCurve []tokenSample
	reaped     int
	// recordsNamingTokens is how many of the storm's node records still
	// name a token at the end.
	recordsNamingTokens int
	// requests is the API server's requests from the storm's start until
	// its tokens were reaped, by verb and resource (apiRequests).
	requests map[string]float64
}

type tokenSample struct {
	at    time.Duration
	alive int
}

// pct is the q-quantile (nearest rank) of d, sorted in place.
func pct(d []time.Duration, q float64) time.Duration {
	slices.Sort(d)
	return benchtest.Quantile(d, q)
}

// latencies returns, for the joins of kind ("" for all), the ticket
// latency (start to acknowledged ticket), the kubelet part (ticket to
// Node Ready) and the whole join (start to Node Ready).
func (r *result) latencies(kind string) (tickets, kubelet, whole []time.Duration) {
	for _, j := range r.joins {
		if kind != "" && j.kind != kind {
			continue
		}
		tickets = append(tickets, j.ticket-j.start)
		kubelet = append(kubelet, j.done-j.ticket)
		whole = append(whole, j.done-j.start)
	}
	return
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }

func (r *result) print(w io.Writer) {
	fmt.Fprintf(w, "\nwhole-join storm: %d agents (%d SEV-SNP test-signer, %d swtpm) at once, through the latchkey-verifier process to the real control plane\n",
		r.agents, r.snp, r.tpm)
	fmt.Fprintf(w, "joined %d, failed %d, in %s: %.1f whole joins/s; attempts retried (admission, connections) %d\n",
		len(r.joins), r.failed, r.wall.Round(time.Millisecond), float64(len(r.joins))/r.wall.Seconds(), r.retried.Load())
	var lastTicket time.Duration
	for _, j := range r.joins {
		lastTicket = max(lastTicket, j.ticket)
	}
	fmt.Fprintf(w, "tickets: all %d in %s (%.1f/s); kubelets that waited for the API server to know their token: %d\n",
		len(r.joins), lastTicket.Round(time.Millisecond), float64(len(r.joins))/lastTicket.Seconds(), waitedJoins(r.joins))
	for _, kind := range []string{"", "snp", "tpm"} {
		t, k, a := r.latencies(kind)
		if len(t) == 0 {
			continue
		}
		label := kind
		if label == "" {
			label = "all"
		}
		fmt.Fprintf(w, "  %-4s ticket p50 %s p99 %s | kubelet (CSR issued, Node Ready) p50 %s p99 %s | whole join p50 %s p99 %s\n",
			label, ms(pct(t, .5)), ms(pct(t, .99)), ms(pct(k, .5)), ms(pct(k, .99)), ms(pct(a, .5)), ms(pct(a, .99)))
	}
	n := float64(max(len(r.joins), 1))
	perJoin := func(d time.Duration) string { return fmt.Sprintf("%.2f ms/join", float64(d.Microseconds())/1000/n) }
	fmt.Fprintf(w, "CPU over the storm: verifier %s (%s)", r.verifierCPU.Round(time.Millisecond), perJoin(r.verifierCPU))
	for _, c := range k8stest.Components {
		fmt.Fprintf(w, ", %s %s (%s)", c, r.controlPlaneCPU[c].Round(time.Millisecond), perJoin(r.controlPlaneCPU[c]))
	}
	fmt.Fprintf(w, ", agents+kubelets %s (%s)\n", r.generatorCPU.Round(time.Millisecond), perJoin(r.generatorCPU))
	fmt.Fprintf(w, "verifier process lifetime: CPU %s, peak RSS %d MiB\n", r.verifierTotal.Round(time.Millisecond), r.verifierRSSKiB/1024)
	zero := "not within the wait"
	if r.tokensZero >= 0 {
		zero = r.tokensZero.Round(time.Millisecond).String()
	}
	fmt.Fprintf(w, "latchkey tokens alive: %d before, %d when the last join was done, %d at the end; back to %d after %s; %d deleted after use by the reaper\n",
		r.tokensBefore, r.tokensAtEnd, r.tokensLeft, r.tokensBefore, zero, r.reaped)
	fmt.Fprintf(w, "node binding records still naming a token at the end: %d of %d\n", r.recordsNamingTokens, r.agents)
	var curve []string
	for i, s := range r.tokenCurve {
		if i%5 == 0 || i == len(r.tokenCurve)-1 {
			curve = append(curve, fmt.Sprintf("%s:%d", s.at.Round(100*time.Millisecond), s.alive))
		}
	}
	fmt.Fprintf(w, "tokens alive after the last join (time:count): %v\n", curve)
	// The joins' completion curve: how many whole joins were done by each
	// tenth of the wall time.
	done := make([]time.Duration, 0, len(r.joins))
	for _, j := range r.joins {
		done = append(done, j.done)
	}
	sort.Slice(done, func(i, j int) bool { return done[i] < done[j] })
	fmt.Fprint(w, "whole joins done by (time:count):")
	for i := 1; i <= 10; i++ {
		at := r.wall * time.Duration(i) / 10
		fmt.Fprintf(w, " %s:%d", at.Round(100*time.Millisecond), sort.Search(len(done), func(k int) bool { return done[k] > at }))
	}
	fmt.Fprintln(w)
}

func (r *result) report(b *testing.B) {
	t, _, a := r.latencies("")
	b.ReportMetric(float64(len(r.joins))/r.wall.Seconds(), "joins/s")
	b.ReportMetric(float64(pct(t, .5).Microseconds())/1000, "ticket-p50-ms")
	b.ReportMetric(float64(pct(t, .99).Microseconds())/1000, "ticket-p99-ms")
	b.ReportMetric(float64(pct(a, .5).Microseconds())/1000, "join-p50-ms")
	b.ReportMetric(float64(pct(a, .99).Microseconds())/1000, "join-p99-ms")
	b.ReportMetric(float64(r.verifierCPU.Microseconds())/1000/float64(max(len(r.joins), 1)), "verifier-cpu-ms/join")
	b.ReportMetric(float64(r.tokensAtEnd), "tokens-at-last-join")
	b.ReportMetric(float64(r.tokensLeft), "tokens-left")
	b.ReportMetric(r.tokensZero.Seconds(), "s-to-zero-tokens")
}

// waitedJoins is how many joins' kubelets had to wait for the API server
// to know their token at least once.
func waitedJoins(js []joined) int {
	n := 0
	for _, j := range js {
		if j.waits > 0 {
			n++
		}
	}
	return n
}
