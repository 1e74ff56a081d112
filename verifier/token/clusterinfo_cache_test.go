package token

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// File discovery reads cluster-info at most once per ClusterInfoMaxAge,
// however many mints share it; a clock that went back reads again.
func TestMintReusesClusterInfoReadForMaxAge(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signNever)
	var gets atomic.Int32
	fc.client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	now := testNow
	k := newTestKube(t, fc, func(c *KubeConfig) { c.Now = func() time.Time { return now } })
	mint := func(node string) {
		t.Helper()
		if _, err := k.Mint(context.Background(), workerReq(node)); err != nil {
			t.Fatal(err)
		}
	}
	mint("n1")
	mint("n2")
	now = now.Add(ClusterInfoMaxAge - time.Millisecond)
	mint("n3")
	if n := gets.Load(); n != 1 {
		t.Fatalf("%d cluster-info reads for three mints within %s, want 1", n, ClusterInfoMaxAge)
	}
	now = now.Add(time.Millisecond)
	mint("n4")
	now = testNow.Add(-time.Hour)
	mint("n5")
	if n := gets.Load(); n != 3 {
		t.Fatalf("%d cluster-info reads, want 3 (one when stale, one when the clock went back)", n)
	}
}
