//go:build k8s

package app_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/logtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/csr"
	"github.com/latchkey/latchkey/verifier/token"
)

// nodeCSR makes the client CSR a bootstrapping kubelet named node makes,
// and waits (as the admin) until it is decided and, if approved, signed
// by the real controller-manager.
func nodeCSR(t *testing.T, tc, admin kubernetes.Interface, node string) *certv1.CertificateSigningRequest {
	t.Helper()
	csr, err := tc.CertificatesV1().CertificateSigningRequests().Create(context.Background(), k8stest.KubeletCSR(t, node), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create CSR: %v", err)
	}
	var got *certv1.CertificateSigningRequest
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = admin.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		denied := slices.ContainsFunc(got.Status.Conditions, func(c certv1.CertificateSigningRequestCondition) bool {
			return c.Type == certv1.CertificateDenied
		})
		return denied || len(got.Status.Certificate) > 0, nil
	})
	if err != nil {
		t.Fatalf("CSR %s not decided: %v", csr.Name, err)
	}
	return got
}

func signedFor(csr *certv1.CertificateSigningRequest) string {
	b, _ := pem.Decode(csr.Status.Certificate)
	if b == nil {
		return ""
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return ""
	}
	return c.Subject.CommonName
}

// Two TPMs of one EK CA against the assembled verifier with the real
// token step, binding Leases and CSR approver, and the real
// controller-manager signing: TPM 2 never gets system:node:node-1, not
// by asking for the name and not with its own token.
func TestK8sIdentityNodeCertificate(t *testing.T) {
	env := k8stest.Load(t)
	sims := tpmtest.StartSiblings(t, 2)
	_, cfg := verifierFiles(t, tpmPolicy(t, sims[0]), make([]byte, 32), "k8s-identity")
	cfg.Kubernetes = &app.Kubernetes{Kubeconfig: env["LATCHKEY_K8S_VERIFIER_KUBECONFIG"]}
	r := &idRig{rig: &rig{logs: &logtest.Buffer{}}, cfg: cfg}
	startAssembled(t, r.rig, cfg, nil)
	admin := env.Admin(t)
	tokens := func() int {
		l, err := admin.CoreV1().Secrets("kube-system").List(context.Background(), metav1.ListOptions{
			LabelSelector: token.ManagedSelector})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	tpm1, tpm2 := tpmIssuer(t, sims[0]), tpmIssuer(t, sims[1])
	before := tokens()

	t1 := r.join(t, tpm1, req("node-1", diskA, false, false))
	checkK8sKeyGeneration(t, r, admin, tpm1, diskA) // rotation: k8s_generation_test.go
	// TPM 2 asking for node-1's name is refused and no token exists.
	_, err := r.agentOnce(t, tpm2).Get(context.Background(), req("node-1", diskB, false, false))
	var re *ticket.RefusedError
	if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_IDENTITY_MISMATCH || !strings.Contains(err.Error(), "node node-1 is bound to another machine") {
		t.Fatalf("TPM 2 as node-1: %v", err)
	}
	if n := tokens(); n != before+1 {
		t.Fatalf("%d latchkey tokens, want %d", n, before+1)
	}
	// TPM 2 joins as itself and tries node-1's certificate with its token.
	t2 := r.join(t, tpm2, req("node-2", diskB, false, false))
	evil := nodeCSR(t, env.TokenClient(t, t2.Token), admin, "node-1")
	if signedFor(evil) != "" || !slices.ContainsFunc(evil.Status.Conditions, func(c certv1.CertificateSigningRequestCondition) bool {
		return c.Type == certv1.CertificateDenied && c.Reason == csr.ReasonDenied
	}) {
		t.Fatalf("TPM 2's CSR for node-1: %+v", evil.Status)
	}
	// TPM 1's token gets node-1's certificate, signed by the real signer.
	good := nodeCSR(t, env.TokenClient(t, t1.Token), admin, "node-1")
	if got := signedFor(good); got != "system:node:node-1" {
		t.Fatalf("TPM 1's CSR: signed %q, status %+v", got, good.Status)
	}
	// TPM 2's CSR for its own name is fine.
	if got := signedFor(nodeCSR(t, env.TokenClient(t, t2.Token), admin, "node-2")); got != "system:node:node-2" {
		t.Fatalf("TPM 2's own CSR: signed %q", got)
	}
	// No latchkey CSR was ever signed for node-1 but TPM 1's.
	csrs, err := admin.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range csrs.Items {
		if signedFor(&c) == "system:node:node-1" && c.Spec.Username != "system:bootstrap:"+t1.Token[:6] {
			t.Fatalf("CSR %s by %s was signed for node-1", c.Name, c.Spec.Username)
		}
	}
}
