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

// runQueued hands every object to a worker, several at once, never one
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
			if c := now.Add(1); c > peak.Load() {
				peak.Store(c)
			}
			time.Sleep(20 * time.Millisecond)
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
	if p := peak.Load(); p < 2 || p > 4 {
		t.Fatalf("peak concurrency %d, want 2 to 4 workers", p)
	}
}
