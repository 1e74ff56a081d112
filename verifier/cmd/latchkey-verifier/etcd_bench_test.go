package main

import (
	"slices"
	"sync"
	"testing"
	"time"

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

// BenchmarkFirstJoinsEtcdVsDir: the same SEV-SNP test-signer agents make
// first joins all at once through one replica on the directory store and
// through three replicas on a three-member TLS etcd, in one run
// (alternating dir, etcd, dir, etcd on fresh disks), then rejoin through
// etcd. Reported: first joins per second and p99 latency of each, their
// ratio, etcd writes (revisions) per first join and per rejoin, and CPU
// per first join (the verifier processes; etcd's members separately).
// LATCHKEY_ETCD_BENCH_AGENTS sets the agent count (default 100).
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
	for range b.N {
		for range 2 {
			base := (len(dir) + len(etcd)) * n
			c0 := f.processCPU(dirRep, false)
			dir = append(dir, f.round(b, agents, f.endpoints(dirRep), base, false))
			dirCPU += f.processCPU(dirRep, false) - c0
			_, rev0 := etcdBindings(b, cli)
			v0, s0 := f.processCPU(etcdReps, false), f.processCPU(nil, true)
			etcd = append(etcd, f.round(b, agents, f.endpoints(etcdReps), base+n, false))
			etcdCPU += f.processCPU(etcdReps, false) - v0
			etcdServerCPU += f.processCPU(nil, true) - s0
			_, rev1 := etcdBindings(b, cli)
			writes += rev1 - rev0
		}
	}
	// Rejoins of the last etcd round's disks.
	_, rev0 := etcdBindings(b, cli)
	f.round(b, agents, f.endpoints(etcdReps), (len(dir)+len(etcd)-1)*n, true)
	_, rev1 := etcdBindings(b, cli)

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
	b.ReportMetric(float64(dirCPU.Milliseconds())/joins, "dir_verifier_cpu_ms/join")
	b.ReportMetric(float64(etcdCPU.Milliseconds())/joins, "etcd_verifiers_cpu_ms/join")
	b.ReportMetric(float64(etcdServerCPU.Milliseconds())/joins, "etcd_members_cpu_ms/join")
}
