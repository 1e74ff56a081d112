package csr

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The approver and the reaper given one factory hold one CSR watch
// between them; each on its own (the control) holds one each.
func TestSharedFactoryHoldsOneCSRWatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared bool
		want   int
	}{{"shared", true, 1}, {"separate", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset()
			var mu sync.Mutex
			watches := map[string]int{}
			seen := make(chan struct{}, 16)
			c.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
				mu.Lock()
				watches[a.GetResource().Resource]++
				mu.Unlock()
				seen <- struct{}{}
				return false, nil, nil
			})
			var f informers.SharedInformerFactory
			if tc.shared {
				f = informers.NewSharedInformerFactory(c, time.Minute)
			}
			a, err := NewApprover(ApproverConfig{Client: c, Informers: f, Tokens: staticTokens{}})
			if err != nil {
				t.Fatal(err)
			}
			r, err := NewReaper(ReaperConfig{Client: c, Informers: f, Revoker: &recordingRevoker{}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { _ = a.Run(ctx) })
			wg.Go(func() { _ = r.Run(ctx) })
			count := func() (csrs, nodes int) {
				mu.Lock()
				defer mu.Unlock()
				return watches["certificatesigningrequests"], watches["nodes"]
			}
			for csrs, nodes := count(); csrs < tc.want || nodes < 1; csrs, nodes = count() {
				select {
				case <-seen:
				case <-time.After(10 * time.Second):
					t.Fatalf("after 10s: CSR watches %d, Node watches %d", csrs, nodes)
				}
			}
			cancel()
			wg.Wait()
			if f != nil {
				f.Shutdown()
			}
			if csrs, nodes := count(); csrs != tc.want || nodes != 1 {
				t.Fatalf("CSR watches %d (want %d), Node watches %d (want 1)", csrs, tc.want, nodes)
			}
		})
	}
}
