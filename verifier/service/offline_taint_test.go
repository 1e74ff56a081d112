package service_test

import (
	"context"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/internal/kubekey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/reattest"
)

// The offline taint end to end on the Lease store and the taint
// controller (fake clientset): a node that reports an offline boot at a
// rejoin is tainted latchkey.io/unattested=offline at the controller's
// next pass, and its next accepted re-attestation, which reports the same
// offline boot, clears it.
func TestOfflineBootTaintsUntilReattested(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	leases, err := binding.NewLeases(binding.LeaseConfig{Client: client, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e := startVerifier(t, envOpt{val: newSealing(offlineMachine), grants: &fakeSigner{}, offline: bounds, minter: &fakeMinter{},
		store: func(binding.Store) binding.Store { return leases }})
	ctl, err := reattest.New(reattest.Config{Client: client, Statuses: leases, Identity: "test"})
	if err != nil {
		t.Fatal(err)
	}
	taint := func() *corev1.Taint {
		t.Helper()
		if err := ctl.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		n, err := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range n.Spec.Taints {
			if n.Spec.Taints[i].Key == kubekey.TaintUnattested {
				return &n.Spec.Taints[i]
			}
		}
		return nil
	}
	mustTicket(t, e, joinHello())
	if tt := taint(); tt != nil {
		t.Fatalf("after the first join: %+v", tt)
	}
	booted := &latchkeyv1.OfflineState{Held: true, BootedOffline: true, Boot: 1, MaxBoots: 3}
	rj := rejoinHello()
	rj.Offline = booted
	mustTicket(t, e, rj)
	if tt := taint(); tt == nil || tt.Value != "offline" || tt.Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("after an offline boot: taint %+v", tt)
	}
	ra := reattestHello()
	ra.Offline = booted
	mustTicket(t, e, ra)
	if tt := taint(); tt != nil {
		t.Fatalf("after the re-attestation: taint %+v", tt)
	}
}
