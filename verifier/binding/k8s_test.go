//go:build k8s

package binding_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/verifier/binding"
)

// The Store contract (claim, racing claims, token, release, takeover)
// against the real API server, with the verifier's narrow credential of
// verifier/deploy: what it does is what the shipped RBAC allows.
func TestK8sLeaseStore(t *testing.T) {
	c := k8stest.Load(t).Verifier(t)
	s, err := binding.NewLeases(binding.LeaseConfig{Client: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("t%d-", time.Now().UnixNano()%1e9)
	testStore(t, s, prefix, fmt.Sprintf("%08x-0000-4000-8000-000000000001", time.Now().UnixNano()&0xffffffff))
	testGenerationStore(t, s, fmt.Sprintf("%08x-0000-4000-8000-000000000002", time.Now().UnixNano()&0xffffffff),
		fmt.Sprintf("%08x-0000-4000-8000-000000000003", time.Now().UnixNano()&0xffffffff))
	// The records are Leases in latchkey-system an operator can read.
	admin := k8stest.Load(t).Admin(t)
	l, err := admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(), "node-"+prefix+"node-1", metav1.GetOptions{})
	if err != nil || *l.Spec.HolderIdentity != idB || l.Labels[kubekey.LabelBinding] != "node" {
		t.Fatalf("lease %+v: %v", l, err)
	}
	// The narrow credential can touch no Lease outside its namespace.
	if _, err := c.CoordinationV1().Leases("kube-system").List(context.Background(), metav1.ListOptions{}); err == nil {
		t.Fatal("the verifier's credential lists kube-system Leases")
	}
}
