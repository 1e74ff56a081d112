//go:build k8s

package token

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"

	"github.com/latchkey/latchkey/internal/benchtest"
	"github.com/latchkey/latchkey/internal/k8stest"
)

// BenchmarkK8sMint is the token step of Hello→Ticket against the real
// control plane: the Secret write plus the wait for the bootstrap signer's
// JWS signature on cluster-info, one mint at a time. It reports the median
// and p99 latency (run with -benchtime=50x for the 50-mint figure).
func BenchmarkK8sMint(b *testing.B) {
	env := loadK8sEnv(b)
	k := env.minter(b, nil)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	ids := make([]string, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		g, err := k.Mint(ctx, workerReq(fmt.Sprintf("bench-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		ids = append(ids, g.ID)
	}
	b.StopTimer()
	reportLatency(b, lat)
	revokeAll(b, k, ids)
}

// BenchmarkK8sMintParallel32 mints with 32 concurrent callers and reports
// mints per second. Run it at a fixed count (-benchtime 300x, 10000x) to
// measure the rate with that many tokens alive at the end of the run: it
// reports the latchkey tokens alive then (tokens-alive), and cluster-info's
// size as served before and after the mints with its resourceVersion, so
// a run shows whether minting rewrote cluster-info.
// The tokens are deleted after the timer stops.
func BenchmarkK8sMintParallel32(b *testing.B) {
	env := loadK8sEnv(b)
	k := env.minter(b, func(c *KubeConfig) { c.Client = env.unthrottledVerifier(b) })
	admin := env.Admin(b)
	ctx := context.Background()
	before := readClusterInfo(b, admin)
	cpu0, self0 := env.CPU(b), benchtest.SelfCPU(b)
	var mu sync.Mutex
	var ids []string
	var lat []time.Duration
	var done []time.Time // completion times, in order
	var node atomic.Int64
	b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t0 := time.Now()
			g, err := k.Mint(ctx, workerReq(fmt.Sprintf("bench-par-%d", node.Add(1))))
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			ids = append(ids, g.ID)
			lat = append(lat, time.Since(t0))
			done = append(done, time.Now())
			mu.Unlock()
		}
	})
	b.StopTimer()
	elapsed := time.Since(start)
	cpu1, self1 := env.CPU(b), benchtest.SelfCPU(b)
	if n := len(done); n >= 2*windowMints {
		// The rate over the first and the last windowMints mints: the
		// last is the rate with (nearly) all b.N tokens alive.
		b.ReportMetric(windowMints/done[windowMints-1].Sub(start).Seconds(), "first300-mints/s")
		b.ReportMetric(windowMints/done[n-1].Sub(done[n-1-windowMints]).Seconds(), "last300-mints/s")
	}
	after := readClusterInfo(b, admin)
	b.ReportMetric(float64(len(ids))/elapsed.Seconds(), "mints/s")
	reportLatency(b, lat)
	perMint := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(len(ids)) }
	for _, c := range k8stest.Components {
		b.ReportMetric(perMint(cpu1[c]-cpu0[c]), c+"-cpu-ms/mint")
	}
	b.ReportMetric(perMint(self1-self0), "client-cpu-ms/mint")
	b.ReportMetric(float64(liveTokens(b, admin)), "tokens-alive")
	b.ReportMetric(float64(before.size), "cluster-info-bytes-before")
	b.ReportMetric(float64(after.size), "cluster-info-bytes-after")
	b.ReportMetric(before.rv, "cluster-info-rv-before")
	b.ReportMetric(after.rv, "cluster-info-rv-after")
	revokeAll(b, k, ids)
}

// windowMints is the window of the first and last rates.
const windowMints = 300

// servedObject is an object's size as the API server serves it (JSON)
// and its resourceVersion.
type servedObject struct {
	size int
	rv   float64
}

// readClusterInfo reads cluster-info as a client sees it, from etcd
// (no resourceVersion: a quorum read, never a stale cache).
func readClusterInfo(b *testing.B, c kubernetes.Interface) servedObject {
	b.Helper()
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/kube-public/configmaps/cluster-info").
		DoRaw(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var meta struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		b.Fatal(err)
	}
	rv, err := strconv.ParseFloat(meta.Metadata.ResourceVersion, 64)
	if err != nil {
		b.Fatalf("cluster-info resourceVersion %q: %v", meta.Metadata.ResourceVersion, err)
	}
	return servedObject{size: len(raw), rv: rv}
}

// liveTokens counts the bootstrap-token Secrets latchkey wrote that exist
// now (metadata only: the benchmark never reads a token's secret).
func liveTokens(b *testing.B, c kubernetes.Interface) int {
	b.Helper()
	n := 0
	err := pager.New(func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
		return c.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, o)
	}).EachListItem(context.Background(), metav1.ListOptions{LabelSelector: ManagedSelector}, func(kruntime.Object) error {
		n++
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(q float64) float64 { return float64(benchtest.Quantile(lat, q).Microseconds()) / 1000 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// revokeAll deletes the tokens with 32 workers (10,000 one by one would
// take longer than the mints).
func revokeAll(b *testing.B, k *Kube, ids []string) {
	work := make(chan string)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for id := range work {
				if err := k.Revoke(context.Background(), id); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
}
