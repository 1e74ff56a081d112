//go:build k8s

package binding_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/verifier/binding"
)

// k8sClient is the credential named by key in the env file
// scripts/controlplane.sh writes ($LATCHKEY_K8S_ENV).
func k8sClient(t *testing.T, key string) kubernetes.Interface {
	t.Helper()
	path := os.Getenv("LATCHKEY_K8S_ENV")
	if path == "" {
		t.Skip("LATCHKEY_K8S_ENV not set; run scripts/test-k8s.sh")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", env[key])
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The Store contract (claim, racing claims, token, release, takeover)
// against the real API server, with the verifier's narrow credential of
// verifier/deploy: what it does is what the shipped RBAC allows.
func TestK8sLeaseStore(t *testing.T) {
	c := k8sClient(t, "LATCHKEY_K8S_VERIFIER_KUBECONFIG")
	s, err := binding.NewLeases(binding.LeaseConfig{Client: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("t%d-", time.Now().UnixNano()%1e9)
	testStore(t, s, prefix, fmt.Sprintf("%08x-0000-4000-8000-000000000001", time.Now().UnixNano()&0xffffffff))
	// The records are Leases in latchkey-system an operator can read.
	admin := k8sClient(t, "LATCHKEY_K8S_ADMIN_KUBECONFIG")
	l, err := admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(), "node-"+prefix+"node-1", metav1.GetOptions{})
	if err != nil || *l.Spec.HolderIdentity != idB || l.Labels[binding.LabelKind] != "node" {
		t.Fatalf("lease %+v: %v", l, err)
	}
	// The narrow credential can touch no Lease outside its namespace.
	if _, err := c.CoordinationV1().Leases("kube-system").List(context.Background(), metav1.ListOptions{}); err == nil {
		t.Fatal("the verifier's credential lists kube-system Leases")
	}
}
