//go:build k8s

package token

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
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
// mints per second.
func BenchmarkK8sMintParallel32(b *testing.B) {
	env := loadK8sEnv(b)
	k := env.minter(b, nil)
	ctx := context.Background()
	var mu sync.Mutex
	var ids []string
	var lat []time.Duration
	b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			t0 := time.Now()
			g, err := k.Mint(ctx, workerReq(fmt.Sprintf("bench-par-%d", time.Now().UnixNano())))
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			ids = append(ids, g.ID)
			lat = append(lat, time.Since(t0))
			mu.Unlock()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(len(ids))/time.Since(start).Seconds(), "mints/s")
	reportLatency(b, lat)
	revokeAll(b, k, ids)
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		i := int(p*float64(len(lat))+0.5) - 1
		return float64(lat[max(0, min(i, len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

func revokeAll(b *testing.B, k *Kube, ids []string) {
	for _, id := range ids {
		if err := k.Revoke(context.Background(), id); err != nil {
			b.Error(err)
		}
	}
}
