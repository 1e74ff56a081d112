//go:build k8s

package reattest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/agent/cordon"
	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/verifier/binding"
)

// On the real API server (Node authorizer, NodeRestriction): the agent's
// cordon client, with a node's own client certificate as the kubelet
// holds it, cordons that Node and annotates it; the same credential may
// not taint its Node (why the agent cordons) nor cordon another Node;
// the controller, with the verifier's shipped RBAC, keeps the node
// tainted offline until a re-attestation after the cordon and then lifts
// taint and cordon together.
func TestK8sAgentCordonAndVerifierUncordon(t *testing.T) {
	env := k8stest.Load(t)
	admin := env.Admin(t)
	ctx := context.Background()
	stamp := time.Now().Format("150405")
	node, other := "cordon-"+stamp, "cordon-other-"+stamp
	for _, n := range []string{node, other} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	kubeconfig := kubeletConfig(t, env, node)

	// The agent's cordon, as after an offline unlock.
	c, err := cordon.New(cordon.Config{NodeName: node, Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Second)
	if r, err := c.Attempt(ctx); r != cordon.Cordoned || err != nil {
		t.Fatalf("cordon: %q %v", r, err)
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at, err := time.Parse(time.RFC3339, n.Annotations[kubekey.AnnotationCordonedAt])
	if !n.Spec.Unschedulable || n.Annotations[kubekey.AnnotationCordoned] != cordon.ValueOffline || err != nil || at.Before(before.Truncate(time.Second)) {
		t.Fatalf("after the cordon: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	// A second attempt (a later offline boot) renews latchkey's own cordon.
	if r, err := c.Attempt(ctx); r != cordon.Renewed || err != nil {
		t.Fatalf("second attempt: %q %v", r, err)
	}

	// The same credential may not taint its own Node.
	kubelet := clientOf(t, kubeconfig)
	taint, _ := json.Marshal(map[string]any{"spec": map[string]any{"taints": []corev1.Taint{{Key: kubekey.TaintUnattested, Value: "offline", Effect: corev1.TaintEffectNoSchedule}}}})
	_, err = kubelet.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, taint, metav1.PatchOptions{})
	if want := fmt.Sprintf(`nodes %q is forbidden: node %q is not allowed to modify taints`, node, node); !apierrors.IsForbidden(err) || err.Error() != want {
		t.Fatalf("taint by the node: %v, want %s", err, want)
	}
	// Nor cordon another Node: the Node authorizer lets it read only its
	// own, so the agent's client stops at the read; a patch sent
	// directly is refused too.
	c2, err := cordon.New(cordon.Config{NodeName: other, Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c2.Attempt(ctx)
	if want := fmt.Sprintf(`cordon: get node %s: HTTP 403 Forbidden: nodes %q is forbidden: User "system:node:%s" cannot get resource "nodes" in API group "" at the cluster scope: node: node '%s' cannot read '%s', only its own Node object`,
		other, other, node, node, other); err == nil || err.Error() != want {
		t.Fatalf("cordon of another node: %v, want %s", err, want)
	}
	cordonPatch, _ := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": true}})
	_, err = kubelet.CoreV1().Nodes().Patch(ctx, other, types.MergePatchType, cordonPatch, metav1.PatchOptions{})
	if want := fmt.Sprintf(`nodes %q is forbidden: node %q is not allowed to modify node %q`, other, node, other); !apierrors.IsForbidden(err) || err.Error() != want {
		t.Fatalf("direct patch of another node: %v, want %s", err, want)
	}
	if o, err := admin.CoreV1().Nodes().Get(ctx, other, metav1.GetOptions{}); err != nil || o.Spec.Unschedulable {
		t.Fatalf("other node: %v %v", o.Spec, err)
	}

	// The verifier: its Lease still shows an attestation from before the
	// offline boot (it never heard of it), so the cordoned node counts as
	// offline: tainted, cordon kept.
	st := binding.NodeStatus{Node: node, Identity: "x", Renewed: before.Add(-time.Minute),
		Last: &binding.Attestation{Time: before.Add(-time.Minute), Decision: binding.DecisionAttested, Reason: "NONE"}}
	ctl, err := New(Config{Client: env.Verifier(t), Statuses: statuses{st}, Identity: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	n, _ = admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if tt := nodeTaint(n); tt == nil || tt.Value != "offline" || !n.Spec.Unschedulable {
		t.Fatalf("before the re-attestation: taint %+v, unschedulable %v", tt, n.Spec.Unschedulable)
	}
	// The re-attestation after the cordon lifts both.
	after := time.Now().Add(time.Second)
	st.Renewed, st.Last = after, &binding.Attestation{Time: after, Decision: binding.DecisionAttested, Reason: "NONE"}
	ctl.cfg.Statuses = statuses{st}
	if err := ctl.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	n, _ = admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if tt := nodeTaint(n); tt != nil || n.Spec.Unschedulable || n.Annotations[kubekey.AnnotationCordoned] != "" || n.Annotations[kubekey.AnnotationCordonedAt] != "" {
		t.Fatalf("after the re-attestation: taint %+v, unschedulable %v, annotations %v", tt, n.Spec.Unschedulable, n.Annotations)
	}
}

func nodeTaint(n *corev1.Node) *corev1.Taint {
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == kubekey.TaintUnattested {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

func clientOf(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kubeletConfig mints the client certificate a kubelet of node holds
// (CN system:node:<node>, O system:nodes) from the test cluster's CA and
// writes a kubeconfig as kubeadm writes kubelet.conf: the CA inline, the
// certificate and key in one file.
func kubeletConfig(t *testing.T, env k8stest.Env, node string) string {
	t.Helper()
	pki := env["LATCHKEY_K8S_PKI"]
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(pki, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		t.Fatal("cluster CA not PEM")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := parseKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:   pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pemPath := filepath.Join(dir, "kubelet-client-current.pem")
	both := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...)
	if err := os.WriteFile(pemPath, both, 0o600); err != nil {
		t.Fatal(err)
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: default-cluster
  cluster:
    certificate-authority-data: %s
    server: https://%s
contexts:
- name: default-context
  context: {cluster: default-cluster, namespace: default, user: default-auth}
current-context: default-context
users:
- name: default-auth
  user: {client-certificate: %s, client-key: %s}
`, base64.StdEncoding.EncodeToString(caPEM), env["LATCHKEY_K8S_ENDPOINT"], pemPath, pemPath)
	path := filepath.Join(dir, "kubelet.conf")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// parseKey reads kubeadm's CA key (PKCS #1 RSA, or PKCS #8).
func parseKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %T is no signer", k)
	}
	return s, nil
}
