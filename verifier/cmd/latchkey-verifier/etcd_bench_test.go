package main

import (
	"bufio"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/latchkey/latchkey/attest/snp/snptest"
)

// stormRound is one round of joins: all agents at once.
type stormRound struct {
	wall      time.Duration
	latencies []time.Duration
}

// round runs every agent's join at once through endpoints, disk UUIDs
// offset by base; any failure fails the benchmark.
func (f *etcdFleet) round(b *testing.B, agents []*stormAgent, endpoints []string, base int, rejoin bool) stormRound {
	b.Helper()
	r := stormRound{latencies: make([]time.Duration, len(agents))}
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range agents {
		a.disk = stormDisk(base + i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			_, errs[i] = f.join(a, endpoints, rejoin, 5*time.Minute)
			r.latencies[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	r.wall = time.Since(start)
	for i, err := range errs {
		if err != nil {
			b.Fatalf("agent %d: %v", i, err)
		}
	}
	return r
}

func p99(rounds ...stormRound) time.Duration {
	var all []time.Duration
	for _, r := range rounds {
		all = append(all, r.latencies...)
	}
	slices.Sort(all)
	return all[(len(all)*99+99)/100-1]
}

// processCPU is the CPU time of every replica process and etcd member.
func (f *etcdFleet) processCPU(rs []*loggedReplica, etcd bool) time.Duration {
	var d time.Duration
	for _, r := range rs {
		d += cpuOf(r.cmd.Process.Pid)
	}
	if etcd {
		for _, m := range f.etcd.Members {
			d += cpuOf(m.PID())
		}
	}
	return d
}

// etcdRequests counts the KV requests every member has served so far, by
// method (Range, Txn, ...), from the members' /metrics.
func (f *etcdFleet) etcdRequests(b *testing.B) map[string]float64 {
	b.Helper()
	c := f.etcd
	tc, err := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile}.ClientConfig()
	if err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	out := map[string]float64{}
	for _, m := range c.Members {
		resp, err := hc.Get(m.ClientURL + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		lines := bufio.NewScanner(resp.Body)
		for lines.Scan() {
			l := lines.Text()
			if !strings.HasPrefix(l, "grpc_server_started_total{") || !strings.Contains(l, `grpc_service="etcdserverpb.KV"`) {
				continue
			}
			_, after, _ := strings.Cut(l, `grpc_method="`)
			method, _, _ := strings.Cut(after, `"`)
			n, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			if err != nil {
				b.Fatalf("%s /metrics: %q: %v", m.Name, l, err)
			}
			out[method] += n
		}
		resp.Body.Close()
		if err := lines.Err(); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// BenchmarkFirstJoinsEtcdVsDir: the same SEV-SNP test-signer agents make
// first joins all at once through one replica on the directory store and
// through three replicas on a three-member TLS etcd, in one run
// (alternating dir, etcd, dir, etcd on fresh disks), then rejoin through
// etcd. Reported: first joins per second and p99 latency of each, their
// ratio, etcd writes (revisions) per first join and per rejoin, and CPU
// per first join (the verifier processes; etcd's members separately).
// LATCHKEY_ETCD_BENCH_AGENTS sets the agent count (default 100);
// LATCHKEY_ETCD_BENCH_PROFILE=DIR writes each replica's CPU profile to
// DIR (r0-0.pprof is the directory store's replica, r1-* etcd's).
func BenchmarkFirstJoinsEtcdVsDir(b *testing.B) {
	n := envInt("LATCHKEY_ETCD_BENCH_AGENTS", 100)
	agents := snpAgents(b, n, 0)
	f := newEtcdFleet(b, 3, map[string]any{"snp": snptest.New(b).Policy()})
	dirRep := f.startReplicas(b, 1, false)
	etcdReps := f.startReplicas(b, 3, true)
	cli := f.etcd.Client(b)
	var dir, etcd []stormRound
	var dirCPU, etcdCPU, etcdServerCPU time.Duration
	var writes int64
	var ranges, txns float64
	for range b.N {
		for range 2 {
			base := (len(dir) + len(etcd)) * n
			c0 := f.processCPU(dirRep, false)
			dir = append(dir, f.round(b, agents, f.endpoints(dirRep), base, false))
			dirCPU += f.processCPU(dirRep, false) - c0
			_, rev0 := etcdBindings(b, cli)
			q0 := f.etcdRequests(b)
			v0, s0 := f.processCPU(etcdReps, false), f.processCPU(nil, true)
			etcd = append(etcd, f.round(b, agents, f.endpoints(etcdReps), base+n, false))
			etcdCPU += f.processCPU(etcdReps, false) - v0
			etcdServerCPU += f.processCPU(nil, true) - s0
			q1 := f.etcdRequests(b)
			ranges += q1["Range"] - q0["Range"]
			txns += q1["Txn"] - q0["Txn"]
			_, rev1 := etcdBindings(b, cli)
			writes += rev1 - rev0
		}
	}
	// Rejoins of the last etcd round's disks.
	_, rev0 := etcdBindings(b, cli)
	f.round(b, agents, f.endpoints(etcdReps), (len(dir)+len(etcd)-1)*n, true)
	_, rev1 := etcdBindings(b, cli)
	if os.Getenv("LATCHKEY_ETCD_BENCH_PROFILE") != "" {
		for _, r := range append(dirRep, etcdReps...) {
			r.saveProfile(b, r.profile)
		}
	}

	rate := func(rs []stormRound) float64 {
		var wall time.Duration
		for _, r := range rs {
			wall += r.wall
		}
		return float64(len(rs)*n) / wall.Seconds()
	}
	joins := float64(len(dir) * n)
	b.ReportMetric(rate(dir), "dir_joins/s")
	b.ReportMetric(rate(etcd), "etcd_joins/s")
	b.ReportMetric(rate(etcd)/rate(dir), "etcd/dir")
	b.ReportMetric(float64(p99(dir...).Milliseconds()), "dir_p99_ms")
	b.ReportMetric(float64(p99(etcd...).Milliseconds()), "etcd_p99_ms")
	b.ReportMetric(float64(writes)/joins, "etcd_writes/first_join")
	b.ReportMetric(float64(rev1-rev0)/float64(n), "etcd_writes/rejoin")
	b.ReportMetric(ranges/joins, "etcd_ranges/first_join")
	b.ReportMetric(txns/joins, "etcd_txns/first_join")
	b.ReportMetric(float64(dirCPU.Milliseconds())/joins, "dir_verifier_cpu_ms/join")
	b.ReportMetric(float64(etcdCPU.Milliseconds())/joins, "etcd_verifiers_cpu_ms/join")
	b.ReportMetric(float64(etcdServerCPU.Milliseconds())/joins, "etcd_members_cpu_ms/join")
}
