package csr

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

// runQueued hands every object to a worker, all n workers at once, never one
// key to two workers at once, and returns when the context ends.
func TestRunQueuedWorkers(t *testing.T) {
	var objs []runtime.Object
	for i := range 40 {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)}})
	}
	f := informers.NewSharedInformerFactory(fake.NewClientset(objs...), 0)
	inf := f.Core().V1().Nodes().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	defer f.Shutdown()
	var mu sync.Mutex
	seen, busy := map[string]int{}, map[string]bool{}
	var now, peak atomic.Int32
	busyAll := make(chan struct{})
	allBusy := sync.OnceFunc(func() { close(busyAll) })
	done := make(chan error, 1)
	go func() {
		done <- runQueued(ctx, inf, 4, func(_ context.Context, obj any) {
			n := obj.(*corev1.Node).Name
			mu.Lock()
			if busy[n] {
				t.Errorf("%s handled by two workers at once", n)
			}
			busy[n] = true
			seen[n]++
			mu.Unlock()
			c := now.Add(1)
			for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
			}
			if c == 4 {
				allBusy()
			}
			// Each handler holds its worker until all four are busy at
			// once: a pool that ran fewer in parallel never gets there.
			select {
			case <-busyAll:
			case <-time.After(10 * time.Second):
				t.Errorf("%s: %d workers busy at once after 10s, want 4", n, now.Load())
			}
			now.Add(-1)
			mu.Lock()
			busy[n] = false
			mu.Unlock()
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == 40 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(seen) != 40 {
		t.Fatalf("handled %d of 40 nodes", len(seen))
	}
	if p := peak.Load(); p != 4 {
		t.Fatalf("peak concurrency %d, want 4 workers", p)
	}
}
