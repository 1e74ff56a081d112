//go:build k8s

package reattest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/logtest"
	"github.com/latchkey/latchkey/verifier/binding"
)

// Two controllers with the verifier's narrow credential (the shipped
// RBAC) on the real API server, on an election Lease of their own: only
// one leads; a silent node is tainted once; when the leader stops, the
// other takes over and does not write the taint again; a node attested
// again is untainted once.
func TestK8sTwoControllersOneLeader(t *testing.T) {
	env := k8stest.Load(t)
	c, admin := env.Verifier(t), env.Admin(t)
	node := "rc-" + time.Now().Format("150405")
	if _, err := admin.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	var mu sync.Mutex
	st := binding.NodeStatus{Node: node, Identity: "x", Renewed: time.Now().Add(-time.Hour)}
	// passes counts each replica's passes: a pass starts by reading the
	// statuses, and a leader's passes run one after another, so pass n+1
	// starting means pass n is done.
	passes := map[string]*atomic.Int32{"a": {}, "b": {}}
	lease := "latchkey-reattest-test-" + node
	logs := &logtest.Buffer{}
	start := func(id string) context.CancelFunc {
		statuses := statusFunc(func() []binding.NodeStatus {
			passes[id].Add(1)
			mu.Lock()
			defer mu.Unlock()
			return []binding.NodeStatus{st}
		})
		ctl, err := New(Config{Client: c, Statuses: statuses, Identity: id, LeaseName: lease, Resync: 200 * time.Millisecond,
			LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(logs, nil)).With("replica", id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { ctl.Run(ctx); close(done) }()
		var once sync.Once
		stop := func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop)
		return stop
	}
	stopA, stopB := start("a"), start("b")
	wait := func(want string) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			n, err := admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, tt := range n.Spec.Taints {
				if tt.Key == kubekey.TaintUnattested {
					got = tt.Value
				}
			}
			if got == want {
				return
			}
		}
		t.Fatalf("taint never became %q\n%s", want, logs)
	}
	// waitPasses waits until replica id has finished `more` passes after
	// the `since` it had started.
	waitPasses := func(id string, since, more int32) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); passes[id].Load() <= since+more; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("replica %s made %d passes, want over %d\n%s", id, passes[id].Load(), since+more, logs)
			}
		}
	}
	wait("stale")
	el, err := admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil || el.Spec.HolderIdentity == nil {
		t.Fatalf("election lease: %+v %v", el, err)
	}
	leader := *el.Spec.HolderIdentity
	if leader != "a" && leader != "b" {
		t.Fatalf("election lease held by %q", leader)
	}
	// Several passes of the leader with the taint in place; the other
	// must not act.
	waitPasses(leader, passes[leader].Load(), 3)
	if leader == "a" {
		stopA()
	} else {
		stopB()
	}
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		el, err = admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(), lease, metav1.GetOptions{})
		if err == nil && el.Spec.HolderIdentity != nil && *el.Spec.HolderIdentity != "" && *el.Spec.HolderIdentity != leader {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no takeover after %s stopped: %+v\n%s", leader, el, logs)
		}
	}
	// The new leader's passes find the taint in place.
	next := *el.Spec.HolderIdentity
	waitPasses(next, passes[next].Load(), 3)
	mu.Lock()
	st.Renewed = time.Now()
	mu.Unlock()
	wait("")
	all := logs.String()
	if n := strings.Count(all, "node tainted unattested"); n != 1 {
		t.Fatalf("%d taint writes, want 1\n%s", n, all)
	}
	if n := strings.Count(all, "taint removed"); n != 1 {
		t.Fatalf("%d taint removals, want 1\n%s", n, all)
	}
	admin.CoordinationV1().Leases(binding.DefaultNamespace).Delete(context.Background(), lease, metav1.DeleteOptions{})
}

type statusFunc func() []binding.NodeStatus

func (f statusFunc) NodeStatuses(context.Context) ([]binding.NodeStatus, error) { return f(), nil }
