package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/verifier/csr"
)

// The checks' logic against a fake clientset: the e2e runs them against
// the real control plane; these pin what each one refuses.

var key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

func csrPEM(t *testing.T, cn string) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// ca returns a new CA and a client certificate it issued for cn/orgs.
func ca(t *testing.T, cn string, orgs []string) (caPEM, certPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func kubeletCSR(t *testing.T, name, node string, cond *certv1.CertificateSigningRequestCondition, issued []byte) *certv1.CertificateSigningRequest {
	r := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Now()},
		Spec: certv1.CertificateSigningRequestSpec{SignerName: certv1.KubeAPIServerClientKubeletSignerName,
			Username: "system:bootstrap:abcdef", Request: csrPEM(t, "system:node:"+node)},
		Status: certv1.CertificateSigningRequestStatus{Certificate: issued},
	}
	if cond != nil {
		r.Status.Conditions = []certv1.CertificateSigningRequestCondition{*cond}
	}
	return r
}

func writeFile(t *testing.T, b []byte) string {
	p := filepath.Join(t.TempDir(), "cert.pem")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCSRDeniedWantsLatchkeysReason(t *testing.T) {
	msg := `latchkey: asks for node "victim", but the token was minted for another attested node`
	for _, tc := range []struct {
		name string
		cond *certv1.CertificateSigningRequestCondition
		want string // "" = the check holds
	}{
		{"latchkey denied", &certv1.CertificateSigningRequestCondition{Type: certv1.CertificateDenied, Reason: csr.ReasonDenied, Message: msg}, ""},
		{"denied for another reason", &certv1.CertificateSigningRequestCondition{Type: certv1.CertificateDenied, Reason: csr.ReasonDenied,
			Message: `latchkey: organization ["x"] is not [system:nodes]`}, `denied with LatchkeyNodeMismatch: "latchkey: organization`},
		{"approved", &certv1.CertificateSigningRequestCondition{Type: certv1.CertificateApproved, Reason: csr.ReasonApproved}, "csr c1 for victim was approved"},
		{"pending", nil, "after 0s: 1 kubelet CSR(s) for victim, none denied yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(kubeletCSR(t, "c1", "victim", tc.cond, nil))
			out, err := csrDenied(context.Background(), c, nil, opts{node: "victim"})
			if tc.want == "" {
				if err != nil || !strings.Contains(out, "csr c1 by system:bootstrap:abcdef denied (LatchkeyNodeMismatch: "+msg+")") {
					t.Fatalf("out %q, err %v", out, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCSRApprovedWantsTheKubeletsCertificate(t *testing.T) {
	_, issued := ca(t, "system:node:n1", []string{"system:nodes"})
	_, other := ca(t, "system:node:n1", []string{"system:nodes"})
	approved := &certv1.CertificateSigningRequestCondition{Type: certv1.CertificateApproved, Reason: csr.ReasonApproved, Message: "latchkey: ok"}
	c := fake.NewClientset(kubeletCSR(t, "c1", "n1", approved, issued))
	if _, err := csrApproved(context.Background(), c, nil, opts{node: "n1", cert: writeFile(t, issued)}); err != nil {
		t.Fatal(err)
	}
	_, err := csrApproved(context.Background(), c, nil, opts{node: "n1", cert: writeFile(t, other)})
	if err == nil || !strings.Contains(err.Error(), "but the kubelet holds another certificate") {
		t.Fatalf("err = %v", err)
	}
	// A CSR older than -since does not count.
	_, err = csrApproved(context.Background(), c, nil, opts{node: "n1", since: time.Now().Add(time.Hour)})
	if err == nil || !strings.Contains(err.Error(), "0 kubelet CSR(s) for n1, none approved") {
		t.Fatalf("err = %v", err)
	}
	// Approved by someone else (kubeadm's auto-approval) is not latchkey's.
	byKCM := &certv1.CertificateSigningRequestCondition{Type: certv1.CertificateApproved, Reason: "AutoApproved"}
	c = fake.NewClientset(kubeletCSR(t, "c2", "n1", byKCM, issued))
	_, err = csrApproved(context.Background(), c, nil, opts{node: "n1"})
	if err == nil || !strings.Contains(err.Error(), `approved with reason "AutoApproved", not latchkey's "LatchkeyAttestedNode"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestClientCertChecksSubjectAndIssuer(t *testing.T) {
	caPEM, good := ca(t, "system:node:n1", []string{"system:nodes"})
	_, foreign := ca(t, "system:node:n1", []string{"system:nodes"})
	_, wrongOrg := ca(t, "system:node:n1", []string{"system:masters"})
	rc := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}}
	if _, err := clientCert(context.Background(), nil, rc, opts{node: "n1", cert: writeFile(t, good)}); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cert []byte
		node string
		want string
	}{
		"another node": {good, "n2", `certificate CN "system:node:n1", want "system:node:n2"`},
		"wrong group":  {wrongOrg, "n1", `certificate O ["system:masters"], want [system:nodes]`},
		"another CA":   {foreign, "n1", "not a client certificate of the cluster CA"},
	} {
		_, err := clientCert(context.Background(), nil, rc, opts{node: tc.node, cert: writeFile(t, tc.cert)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
}

func TestNodeReadyWantsAFreshHeartbeat(t *testing.T) {
	beat := time.Now().Add(-time.Minute).Truncate(time.Second)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.NewTime(beat)}}}}
	c := fake.NewClientset(n)
	if _, err := nodeReady(context.Background(), c, nil, opts{node: "n1", since: beat}); err != nil {
		t.Fatal(err)
	}
	_, err := nodeReady(context.Background(), c, nil, opts{node: "n1", since: beat.Add(time.Second)})
	if err == nil || !strings.Contains(err.Error(), "node n1 Ready=True reason=KubeletReady") {
		t.Fatalf("a stale heartbeat passed: %v", err)
	}
	_, err = nodeReady(context.Background(), c, nil, opts{node: "n2"})
	if err == nil || !strings.Contains(err.Error(), "node n2 not registered") {
		t.Fatalf("err = %v", err)
	}
}

// untainted refuses a Node that carries the unattested taint (naming its
// value and effect) and a missing Node; another taint does not count.
func TestUntaintedWantsNoUnattestedTaint(t *testing.T) {
	ctx := context.Background()
	node := func(taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	offline := corev1.Taint{Key: "latchkey.io/unattested", Value: "offline", Effect: corev1.TaintEffectNoSchedule}
	other := corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}
	_, err := untainted(ctx, fake.NewClientset(node(other, offline)), nil, opts{node: "n1"})
	if want := "after 0s: node n1 has taint latchkey.io/unattested=offline:NoSchedule"; err == nil || err.Error() != want {
		t.Fatalf("tainted: %v, want %q", err, want)
	}
	if _, err := untainted(ctx, fake.NewClientset(), nil, opts{node: "n1"}); err == nil || err.Error() != "no node n1" {
		t.Fatalf("no node: %v", err)
	}
	out, err := untainted(ctx, fake.NewClientset(node(other)), nil, opts{node: "n1"})
	if err != nil || out != "node n1 has no latchkey.io/unattested taint (1 taint(s))" {
		t.Fatalf("untainted: %q, %v", out, err)
	}
}

// cordoned wants latchkey's cordon: unschedulable with the annotation and
// its time; an operator's cordon (no annotation) or the annotation on a
// schedulable Node is not it. uncordoned wants neither the cordon nor an
// annotation left behind.
func TestCordonedAndUncordoned(t *testing.T) {
	ctx := context.Background()
	node := func(unschedulable bool, ann map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: ann}, Spec: corev1.NodeSpec{Unschedulable: unschedulable}}
	}
	ours := map[string]string{kubekey.AnnotationCordoned: "offline", kubekey.AnnotationCordonedAt: "2026-12-06T17:00:00Z"}
	out, err := cordoned(ctx, fake.NewClientset(node(true, ours)), nil, opts{node: "n1"})
	if err != nil || out != "node n1 cordoned by latchkey offline at 2026-12-06T17:00:00Z" {
		t.Fatalf("cordoned: %q, %v", out, err)
	}
	_, err = cordoned(ctx, fake.NewClientset(node(true, nil)), nil, opts{node: "n1"})
	if want := `after 0s: node n1 unschedulable=true latchkey.io/cordoned="" latchkey.io/cordoned-at=""`; err == nil || err.Error() != want {
		t.Fatalf("operator's cordon: %v, want %s", err, want)
	}
	_, err = cordoned(ctx, fake.NewClientset(node(false, ours)), nil, opts{node: "n1"})
	if want := `after 0s: node n1 unschedulable=false latchkey.io/cordoned="offline" latchkey.io/cordoned-at="2026-12-06T17:00:00Z"`; err == nil || err.Error() != want {
		t.Fatalf("annotation without the cordon: %v, want %s", err, want)
	}
	out, err = uncordoned(ctx, fake.NewClientset(node(false, nil)), nil, opts{node: "n1"})
	if err != nil || out != "node n1 schedulable, no latchkey cordon annotation" {
		t.Fatalf("uncordoned: %q, %v", out, err)
	}
	_, err = uncordoned(ctx, fake.NewClientset(node(false, map[string]string{kubekey.AnnotationCordonedAt: "x"})), nil, opts{node: "n1"})
	if want := "after 0s: node n1 unschedulable=false, latchkey cordon annotations: false true"; err == nil || err.Error() != want {
		t.Fatalf("annotation left behind: %v, want %s", err, want)
	}
	if _, err := uncordoned(ctx, fake.NewClientset(), nil, opts{node: "n1"}); err == nil || err.Error() != "no node n1" {
		t.Fatalf("no node: %v", err)
	}
}
