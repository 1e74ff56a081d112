//go:build k8s

package app_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/kubekey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// checkK8sKeyGeneration: against the real API server, with the shipped
// RBAC, a first join's disk Lease records generation 0 (the verifier's
// only one) in the same create, and a rejoin naming a generation the
// verifier never served (above its newest) is refused as
// KEY_GENERATION_RETIRED, naming it as unknown, and leaves the record as
// it was.
func checkK8sKeyGeneration(t *testing.T, r *idRig, admin kubernetes.Interface, iss attest.Issuer, disk string) {
	t.Helper()
	annotation := func() string {
		l, err := admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(),
			binding.ObjectName(binding.Disk, disk), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Annotations[kubekey.AnnotationKeyGeneration]
	}
	if got := annotation(); got != "0" {
		t.Fatalf("disk Lease %s = %q after a first join, want 0", kubekey.AnnotationKeyGeneration, got)
	}
	q := req("node-1", disk, true, false)
	five := uint32(5)
	q.DiskKeyGeneration = &five
	_, err := r.agentOnce(t, iss).Get(context.Background(), q)
	var re *ticket.RefusedError
	if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_KEY_GENERATION_RETIRED ||
		!strings.Contains(re.Detail, "names master-secret generation 5, which is unknown to this verifier (it serves 0)") {
		t.Fatalf("rejoin naming generation 5: %v", err)
	}
	if got := annotation(); got != "0" {
		t.Fatalf("after the refusal the record says %q, want 0", got)
	}
}
