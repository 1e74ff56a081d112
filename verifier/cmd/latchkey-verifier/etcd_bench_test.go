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

// series is one store's measured rounds and the CPU they took: the
// verifier processes, etcd's members (etcd only) and this process, which
// runs the agents.
type series struct {
	rounds                     []stormRound
	verifiers, members, agents time.Duration
	// retries counts the attempts that failed and were retried (mostly
	// admission control's RESOURCE_EXHAUSTED).
	retries int64
}

// measure runs one round of first joins through reps, on disks from
// base, and adds it and its CPU to s.
func (f *etcdFleet) measure(b *testing.B, s *series, agents []*stormAgent, reps []*loggedReplica, onEtcd bool, base int) {
	v0, m0, a0, r0 := f.processCPU(reps, false), f.processCPU(nil, onEtcd), cpuOf(os.Getpid()), f.failed.Load()
	s.rounds = append(s.rounds, f.round(b, agents, f.endpoints(reps), base, false))
	s.retries += f.failed.Load() - r0
	s.verifiers += f.processCPU(reps, false) - v0
	s.members += f.processCPU(nil, onEtcd) - m0
	s.agents += cpuOf(os.Getpid()) - a0
}

func (s *series) joins() float64 {
	var n int
	for _, r := range s.rounds {
		n += len(r.latencies)
	}
	return float64(n)
}

func (s *series) rate() float64 {
	var wall time.Duration
	for _, r := range s.rounds {
		wall += r.wall
	}
	return s.joins() / wall.Seconds()
}

// perJoin is CPU per join in milliseconds.
func (s *series) perJoin(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000 / s.joins()
}

// freshAgents are n SEV-SNP machines no replica has seen, chips from
// *chip on.
func freshAgents(b *testing.B, chip *int, n int) []*stormAgent {
	out := make([]*stormAgent, n)
	for i := range out {
		out[i] = snpAgent(b, *chip+i)
	}
	*chip += n
	return out
}

// BenchmarkFirstJoinsEtcdVsDir: SEV-SNP test-signer agents make first
// joins all at once through one replica on the directory store and
// through three replicas on a three-member TLS etcd, in one run,
// alternating dir and etcd rounds on fresh disks, then rejoin through
// etcd. Two series, so each store is measured on like terms:
//
//   - cold: every round is machines no replica has seen, as a first
//     join is (each replica verifies each VCEK chain once and caches it,
//     so reused machines would favour the one replica that has seen them
//     all);
//   - warm: one set of machines every replica has verified first (an
//     unmeasured round through each), so the rounds differ in the store
//     and the replica count alone; a third store in this series is one
//     replica on etcd, the same process count and admission limit as the
//     directory store's.
//
// Reported per series: first joins per second and p99 latency of each
// store and their ratio, and CPU per first join of the verifier
// processes, etcd's members and the agents (this process); and etcd
// writes (revisions) and requests per first join and writes per rejoin.
// LATCHKEY_ETCD_BENCH_AGENTS sets the agent count (default 100);
// LATCHKEY_ETCD_BENCH_PROFILE=DIR writes each replica's CPU profile to
// DIR (r0-0.pprof is the directory store's replica, r1-* the three on
// etcd, r4-0 the one on etcd).
func BenchmarkFirstJoinsEtcdVsDir(b *testing.B) {
	n := envInt("LATCHKEY_ETCD_BENCH_AGENTS", 100)
	f := newEtcdFleet(b, 3, map[string]any{"snp": snptest.New(b).Policy()})
	dirRep := f.startReplicas(b, 1, false)
	etcdReps := f.startReplicas(b, 3, true)
	etcdOne := f.startReplicas(b, 1, true)
	cli := f.etcd.Client(b)
	chip, disk := 0, 0
	nextDisks := func() int { disk += n; return disk - n }
	var cold, warm [3]series // dir, etcd (3 replicas), etcd (1 replica, warm only)
	var writes int64
	var ranges, txns float64
	var warmAgents []*stormAgent
	lastEtcd := 0
	etcdRound := func(s *series, agents []*stormAgent, reps []*loggedReplica) {
		_, rev0 := etcdBindings(b, cli)
		q0 := f.etcdRequests(b)
		lastEtcd = nextDisks()
		f.measure(b, s, agents, reps, true, lastEtcd)
		q1 := f.etcdRequests(b)
		_, rev1 := etcdBindings(b, cli)
		writes += rev1 - rev0
		ranges += q1["Range"] - q0["Range"]
		txns += q1["Txn"] - q0["Txn"]
	}
	for range b.N {
		for range 2 {
			f.measure(b, &cold[0], freshAgents(b, &chip, n), dirRep, false, nextDisks())
			etcdRound(&cold[1], freshAgents(b, &chip, n), etcdReps)
		}
		warmAgents = freshAgents(b, &chip, n)
		for _, r := range append(append(append([]*loggedReplica{}, dirRep...), etcdOne...), etcdReps...) {
			f.round(b, warmAgents, f.endpoints([]*loggedReplica{r}), nextDisks(), false)
		}
		for range 2 {
			f.measure(b, &warm[0], warmAgents, dirRep, false, nextDisks())
			etcdRound(&warm[2], warmAgents, etcdOne)
			etcdRound(&warm[1], warmAgents, etcdReps)
		}
	}
	// Rejoins of the last etcd round's disks.
	_, rev0 := etcdBindings(b, cli)
	f.round(b, warmAgents, f.endpoints(etcdReps), lastEtcd, true)
	_, rev1 := etcdBindings(b, cli)
	if os.Getenv("LATCHKEY_ETCD_BENCH_PROFILE") != "" {
		for _, r := range append(append(dirRep, etcdReps...), etcdOne...) {
			r.saveProfile(b, r.profile)
		}
	}

	etcdJoins := cold[1].joins() + warm[1].joins() + warm[2].joins()
	b.ReportMetric(float64(writes)/etcdJoins, "etcd_writes/first_join")
	b.ReportMetric(ranges/etcdJoins, "etcd_ranges/first_join")
	b.ReportMetric(txns/etcdJoins, "etcd_txns/first_join")
	b.ReportMetric(float64(rev1-rev0)/float64(n), "etcd_writes/rejoin")
	for _, x := range []struct {
		name string
		s    *[3]series
	}{{"cold", &cold}, {"warm", &warm}} {
		d, e := &x.s[0], &x.s[1]
		b.ReportMetric(d.rate(), x.name+"_dir_joins/s")
		b.ReportMetric(e.rate(), x.name+"_etcd_joins/s")
		b.ReportMetric(e.rate()/d.rate(), x.name+"_etcd/dir")
		b.ReportMetric(float64(p99(d.rounds...).Milliseconds()), x.name+"_dir_p99_ms")
		b.ReportMetric(float64(p99(e.rounds...).Milliseconds()), x.name+"_etcd_p99_ms")
		b.ReportMetric(d.perJoin(d.verifiers), x.name+"_dir_verifier_cpu_ms/join")
		b.ReportMetric(e.perJoin(e.verifiers), x.name+"_etcd_verifiers_cpu_ms/join")
		b.ReportMetric(e.perJoin(e.members), x.name+"_etcd_members_cpu_ms/join")
		b.ReportMetric(d.perJoin(d.agents), x.name+"_dir_agents_cpu_ms/join")
		b.ReportMetric(e.perJoin(e.agents), x.name+"_etcd_agents_cpu_ms/join")
		b.ReportMetric(float64(d.retries)/d.joins(), x.name+"_dir_retries/join")
		b.ReportMetric(float64(e.retries)/e.joins(), x.name+"_etcd_retries/join")
	}
	// One replica on etcd against one on the directory store: the same
	// process count, admission limit and warm caches; the store alone
	// differs.
	d, one := &warm[0], &warm[2]
	b.ReportMetric(one.rate(), "warm_etcd1_joins/s")
	b.ReportMetric(one.rate()/d.rate(), "warm_etcd1/dir")
	b.ReportMetric(float64(p99(one.rounds...).Milliseconds()), "warm_etcd1_p99_ms")
	b.ReportMetric(one.perJoin(one.verifiers), "warm_etcd1_verifier_cpu_ms/join")
	b.ReportMetric(one.perJoin(one.members), "warm_etcd1_members_cpu_ms/join")
	b.ReportMetric(float64(one.retries)/one.joins(), "warm_etcd1_retries/join")
}
