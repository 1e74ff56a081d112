package csr

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/verifier/token"
)

func csrPEM(t *testing.T, cn string, org []string, dns []string, ips []net.IP) []byte {
	t.Helper()
	return pkitest.CSRPEM(t, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cn, Organization: org}, DNSNames: dns, IPAddresses: ips,
	})
}

var clientUsages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}

// latchkeyCSR is a kubelet client CSR made with a token minted for minted.
func latchkeyCSR(t *testing.T, name, minted, asks string) *certv1.CertificateSigningRequest {
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    csrPEM(t, "system:node:"+asks, []string{"system:nodes"}, nil, nil),
			SignerName: certv1.KubeAPIServerClientKubeletSignerName,
			Usages:     clientUsages,
			Username:   "system:bootstrap:abcdef",
			Groups:     []string{"system:bootstrappers", token.Group, token.NodeGroup(minted), "system:authenticated"},
		},
	}
}

func newTestApprover(t *testing.T, serving bool, objs ...*certv1.CertificateSigningRequest) (*Approver, *fake.Clientset) {
	t.Helper()
	c := fake.NewClientset()
	for _, o := range objs {
		if _, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a, err := NewApprover(ApproverConfig{Client: c, Tokens: staticTokens{"node-a": "abcdef", "node-b": "zzzzzz"}, ServingCertificates: serving, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return a, c
}

// staticTokens is the binding records' node -> token ID, for unit tests
// of the approver's logic (the real store is tested in verifier/binding
// and against the real control plane).
type staticTokens map[string]string

func (s staticTokens) NodeTokenID(_ context.Context, node string) (string, error) {
	if node == "unreadable" {
		return "", errors.New("apiserver down")
	}
	return s[node], nil
}

func condition(t *testing.T, c *fake.Clientset, name string) *certv1.CertificateSigningRequestCondition {
	t.Helper()
	csr, err := c.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(csr.Status.Conditions) == 0 {
		return nil
	}
	return &csr.Status.Conditions[0]
}

func TestApproverBindsClientCSRToAttestedNode(t *testing.T) {
	good := latchkeyCSR(t, "good", "node-a", "node-a")
	bad := latchkeyCSR(t, "bad", "node-a", "node-b")
	a, c := newTestApprover(t, false, good, bad)
	a.Handle(context.Background(), good)
	a.Handle(context.Background(), bad)
	if cond := condition(t, c, "good"); cond == nil || cond.Type != certv1.CertificateApproved || cond.Reason != ReasonApproved {
		t.Fatalf("good: %+v", cond)
	}
	cond := condition(t, c, "bad")
	if cond == nil || cond.Type != certv1.CertificateDenied || cond.Reason != ReasonDenied ||
		!strings.Contains(cond.Message, `asks for node "node-b"`) {
		t.Fatalf("bad: %+v", cond)
	}
	evs, _ := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	var warned bool
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == "bad" && e.Type == corev1.EventTypeWarning && e.Reason == ReasonDenied {
			warned = true
		}
	}
	// The approval's reason is in its condition only: one event, the
	// denial's.
	if len(evs.Items) != 1 || !warned {
		t.Fatalf("events %+v", evs.Items)
	}
}

func TestApproverClientCSRRules(t *testing.T) {
	a, _ := newTestApprover(t, false)
	ctx := context.Background()
	cases := map[string]struct {
		mod  func(*certv1.CertificateSigningRequest)
		want Verdict
		why  string
	}{
		"kubeadm token": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Groups = []string{"system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token"}
		}, Ignore, "not made with a latchkey token"},
		"node renewal": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Username, c.Spec.Groups = "system:node:node-a", []string{"system:nodes"}
		}, Ignore, "not made with a latchkey token"},
		"wrong org": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Request = csrPEM(t, "system:node:node-a", []string{"system:masters"}, nil, nil)
		}, Deny, "organization"},
		"not a node": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Request = csrPEM(t, "admin", []string{"system:nodes"}, nil, nil)
		}, Deny, "is not system:node:<name>"},
		"SANs": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Request = csrPEM(t, "system:node:node-a", []string{"system:nodes"}, []string{"x.example"}, nil)
		}, Deny, "subject alternative names"},
		"server usage": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Usages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}
		}, Deny, "usages"},
		"garbage": {func(c *certv1.CertificateSigningRequest) { c.Spec.Request = []byte("x") }, Deny, "not a PEM"},
		"decided": {func(c *certv1.CertificateSigningRequest) {
			c.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateDenied}}
		}, Ignore, "already decided"},
		"token not the bound one": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Username = "system:bootstrap:qqqqqq"
		}, Deny, `node "node-a" is bound to a machine that was given another token than qqqqqq`},
		"name bound to another token, group forged for it": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Request = csrPEM(t, "system:node:node-b", []string{"system:nodes"}, nil, nil)
			c.Spec.Groups = []string{"system:bootstrappers", token.Group, token.NodeGroup("node-b")}
		}, Deny, `node "node-b" is bound to a machine that was given another token than abcdef`},
		"no binding record": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Request = csrPEM(t, "system:node:node-c", []string{"system:nodes"}, nil, nil)
			c.Spec.Groups = []string{"system:bootstrappers", token.Group, token.NodeGroup("node-c")}
		}, Deny, `node "node-c" has no binding record naming a token`},
		"record unreadable": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Request = csrPEM(t, "system:node:unreadable", []string{"system:nodes"}, nil, nil)
			c.Spec.Groups = []string{"system:bootstrappers", token.Group, token.NodeGroup("unreadable")}
		}, Ignore, "not readable yet: apiserver down"},
		"key encipherment ok": {func(c *certv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certv1.UsageKeyEncipherment)
		}, Approve, "was attested"},
	}
	for name, tc := range cases {
		csr := latchkeyCSR(t, "x", "node-a", "node-a")
		tc.mod(csr)
		v, why := a.Decide(ctx, csr)
		if v != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %v %q, want %v %q", name, v, why, tc.want, tc.why)
		}
	}
}

func servingCSR(t *testing.T, user, cn string, dns []string, ips []net.IP) *certv1.CertificateSigningRequest {
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "serving"},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    csrPEM(t, cn, []string{"system:nodes"}, dns, ips),
			SignerName: certv1.KubeletServingSignerName,
			Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageServerAuth},
			Username:   user,
			Groups:     []string{"system:nodes", "system:authenticated"},
		},
	}
}

func TestApproverServing(t *testing.T) {
	ctx := context.Background()
	off, _ := newTestApprover(t, false)
	ok := servingCSR(t, "system:node:node-a", "system:node:node-a", []string{"node-a"}, []net.IP{net.ParseIP("10.0.0.5")})
	if v, _ := off.Decide(ctx, ok); v != Ignore {
		t.Fatalf("serving CSR decided with serving off: %v", v)
	}
	a, c := newTestApprover(t, true)
	if v, why := a.Decide(ctx, ok); v != Ignore || !strings.Contains(why, "not readable") {
		t.Fatalf("before the node exists: %v %q", v, why)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node-a"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.5"}}}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, why := a.Decide(ctx, ok); v != Approve {
		t.Fatalf("own addresses: %v %q", v, why)
	}
	cases := map[string]*certv1.CertificateSigningRequest{
		"other node's name": servingCSR(t, "system:node:node-a", "system:node:node-b", []string{"node-a"}, nil),
		"foreign IP":        servingCSR(t, "system:node:node-a", "system:node:node-a", nil, []net.IP{net.ParseIP("10.9.9.9")}),
		"no SANs":           servingCSR(t, "system:node:node-a", "system:node:node-a", nil, nil),
	}
	for name, csr := range cases {
		if v, why := a.Decide(ctx, csr); v != Deny {
			t.Errorf("%s: %v %q", name, v, why)
		}
	}
}
