//go:build k8s

package app_test

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/logtest"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	"github.com/latchkey/latchkey/verifier/app"
)

// TestK8sTokensListRevoke runs `latchkey-verifier tokens list|revoke`'s
// admin calls against the real control plane with the verifier's narrow
// credential: the user bound only by the shipped verifier/deploy
// manifests (scripts/controlplane.sh applies them), which may not read
// any Secret. The list comes from the node binding Leases and a dry-run
// delete per token; a token latchkey did not mint is never touched.
func TestK8sTokensListRevoke(t *testing.T) {
	env := k8stest.Load(t)
	ctx := context.Background()
	admin := env.Admin(t)
	// The credential is the narrow one: listing or reading Secrets is
	// forbidden.
	if _, err := env.Verifier(t).CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the verifier's credential lists Secrets: %v; want Forbidden", err)
	}
	sims := tpmtest.StartSiblings(t, 2)
	dir, cfg := verifierFiles(t, tpmPolicy(t, sims[0]), make([]byte, 32), "k8s-tokens")
	cfg.AdminSocket, cfg.Kubernetes = filepath.Join(dir, "admin.sock"), &app.Kubernetes{Kubeconfig: env["LATCHKEY_K8S_VERIFIER_KUBECONFIG"]}
	r := &idRig{rig: &rig{logs: &logtest.Buffer{}}, cfg: cfg}
	startAssembled(t, r.rig, cfg, nil)
	suffix := time.Now().Format("150405")
	nodeA, nodeB := "tokens-a-"+suffix, "tokens-b-"+suffix
	issA, diskA := tpmIssuer(t, sims[0]), uuid.NewString()
	first := r.join(t, issA, req(nodeA, diskA, false, false))
	tB := r.join(t, tpmIssuer(t, sims[1]), req(nodeB, uuid.NewString(), false, false))
	// Node A asks again before its first join finished: the new token
	// replaces the first on its record, and the first is deleted (no
	// record would name it, and the approver no longer honours it).
	tA := r.join(t, issA, req(nodeA, diskA, false, false))
	idA, idB := tA.Token[:6], tB.Token[:6]
	if _, err := admin.CoreV1().Secrets("kube-system").Get(ctx, bootstrapapi.BootstrapTokenSecretPrefix+first.Token[:6], metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("node A's replaced token %s: %v, want NotFound", first.Token[:6], err)
	}

	// A kubeadm token nobody asked latchkey for, with an ID of its own.
	foreign := "zz" + suffix[2:]
	_, err := admin.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.BootstrapTokenSecretPrefix + foreign, Namespace: "kube-system"},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		StringData: map[string]string{bootstrapapi.BootstrapTokenIDKey: foreign, bootstrapapi.BootstrapTokenSecretKey: "0123456789abcdef",
			bootstrapapi.BootstrapTokenUsageAuthentication: "true"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.CoreV1().Secrets("kube-system").Delete(context.Background(), bootstrapapi.BootstrapTokenSecretPrefix+foreign, metav1.DeleteOptions{})
	})

	api := r.admin(t)
	list := func() map[string]*adminv1.Token {
		t.Helper()
		resp, err := api.ListTokens(ctx, &adminv1.ListTokensRequest{})
		if err != nil {
			t.Fatalf("list tokens: %v", err)
		}
		out := map[string]*adminv1.Token{}
		for _, tk := range resp.GetTokens() {
			out[tk.GetId()] = tk
		}
		return out
	}
	got := list()
	for id, node := range map[string]string{idA: nodeA, idB: nodeB} {
		tk := got[id]
		if tk == nil || tk.GetNodeName() != node {
			t.Fatalf("token %s of %s: listed %+v (all: %v)", id, node, tk, slices.Collect(maps.Keys(got)))
		}
		if d := time.Until(time.Unix(tk.GetExpiryUnix(), 0)); d < 28*time.Minute || d > 31*time.Minute {
			t.Fatalf("token %s expires in %s, want the default TTL (30m)", id, d)
		}
	}
	if got[foreign] != nil {
		t.Fatalf("the foreign token %s is listed", foreign)
	}

	// Revoking the foreign token or an unknown one is NOT_FOUND, and the
	// foreign token's Secret is untouched.
	for _, id := range []string{foreign, "unkn00"} {
		_, err := api.RevokeToken(ctx, &adminv1.RevokeTokenRequest{Id: id})
		want := "no bootstrap token " + id + ": not the token of any node this cluster's verifiers bound (latchkey deletes only its own)"
		if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != want {
			t.Fatalf("revoke %s: %v, want NotFound %q", id, err, want)
		}
	}
	if _, err := admin.CoreV1().Secrets("kube-system").Get(ctx, bootstrapapi.BootstrapTokenSecretPrefix+foreign, metav1.GetOptions{}); err != nil {
		t.Fatalf("the foreign token's Secret after the refused revoke: %v", err)
	}

	// Revoking node A's token deletes its Secret and leaves B's.
	if _, err := api.RevokeToken(ctx, &adminv1.RevokeTokenRequest{Id: idA}); err != nil {
		t.Fatalf("revoke %s: %v", idA, err)
	}
	if _, err := admin.CoreV1().Secrets("kube-system").Get(ctx, bootstrapapi.BootstrapTokenSecretPrefix+idA, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("token %s after its revoke: %v, want NotFound", idA, err)
	}
	got = list()
	if got[idA] != nil || got[idB] == nil {
		t.Fatalf("after revoking %s: listed %v", idA, slices.Collect(maps.Keys(got)))
	}
	// A second revoke is NOT_FOUND: the record no longer names it.
	// (A token deleted behind the verifier's back while the record still
	// names it is "already gone"; admin_test.go.)
	_, err = api.RevokeToken(ctx, &adminv1.RevokeTokenRequest{Id: idA})
	want := "no bootstrap token " + idA + ": not the token of any node this cluster's verifiers bound (latchkey deletes only its own)"
	if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != want {
		t.Fatalf("second revoke of %s: %v", idA, err)
	}
	// A token deleted behind the verifier's back (the tokencleaner, the
	// reaper) is no longer listed.
	if err := admin.CoreV1().Secrets("kube-system").Delete(ctx, bootstrapapi.BootstrapTokenSecretPrefix+idB, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := list(); got[idB] != nil {
		t.Fatalf("token %s is listed after its Secret was deleted", idB)
	}
}
