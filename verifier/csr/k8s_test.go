//go:build k8s

package csr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/latchkey/latchkey/internal/k8stest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/deploy"
	"github.com/latchkey/latchkey/verifier/token"
)

// TestMain installs the shipped RBAC, so the tests run with exactly the
// verifier's narrow credential.
func TestMain(m *testing.M) { k8stest.Main(m, deploy.Apply) }

// start runs the approver with the verifier's credential until the test
// ends, reading binding Leases, and returns the Lease store and a minter.
func start(t *testing.T) (context.Context, k8stest.Env, *binding.Leases, *token.Kube) {
	t.Helper()
	env := k8stest.Load(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	leases, err := binding.NewLeases(binding.LeaseConfig{Client: env.Verifier(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewApprover(ApproverConfig{Client: env.Verifier(t), Tokens: leaseTokens{leases},
		Logger: slog.New(slog.DiscardHandler), Resync: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go a.Run(ctx)
	return ctx, env, leases, minter(t, env)
}

// minter mints real tokens with the verifier's credential.
func minter(t *testing.T, env k8stest.Env) *token.Kube {
	t.Helper()
	k, err := token.NewKube(token.KubeConfig{Client: env.Verifier(t), SignatureWait: 30 * time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func workerReq(node string) token.Request {
	return token.Request{NodeName: node, Role: latchkeyv1.Role_ROLE_WORKER, EvidenceDigest: "sha256:" + strings.Repeat("ab", 32)}
}

// kubeletCSR makes the CSR a kubelet bootstrapping as node makes.
func kubeletCSR(t *testing.T, c kubernetes.Interface, node string) *certv1.CertificateSigningRequest {
	t.Helper()
	out, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), k8stest.KubeletCSR(t, node), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create CSR with the bootstrap token: %v", err)
	}
	return out
}

// waitCSR waits until the CSR is decided (and, when approved, signed).
func waitCSR(t *testing.T, c kubernetes.Interface, name string) *certv1.CertificateSigningRequest {
	t.Helper()
	var got *certv1.CertificateSigningRequest
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		csr, err := c.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = csr
		for _, cond := range csr.Status.Conditions {
			if cond.Type == certv1.CertificateDenied {
				return true, nil
			}
		}
		return len(csr.Status.Certificate) > 0, nil
	})
	if err != nil {
		t.Fatalf("CSR %s not decided: %v (%+v)", name, err, got.Status)
	}
	return got
}

// The kubelet identity is bound to the attestation: the approver approves
// the attested node's client CSR (the real controller-manager signs it)
// when its binding Lease records the token, and denies the same token's
// CSR for another node name, and a CSR for the node made with a token
// that carries the node's group but is not the one its Lease records.
func TestK8sCSRIdentityBinding(t *testing.T) {
	ctx, env, leases, k := start(t)
	g, err := k.Mint(ctx, workerReq("attested-node"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Revoke(context.Background(), g.ID)
	const machine = "tpm-ek:sha256:1111111111111111111111111111111111111111111111111111111111111111"
	if _, err := leases.Claim(ctx, binding.Node, "attested-node", machine); err != nil {
		t.Fatal(err)
	}
	if err := leases.SetToken(ctx, "attested-node", machine, g.ID); err != nil {
		t.Fatal(err)
	}
	tc := env.TokenClient(t, g.Token)
	admin := env.Admin(t)

	// A second token for the same name (its per-node group is right) that
	// the Lease does not record: a leaked group is not enough.
	other, err := k.Mint(ctx, workerReq("attested-node"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Revoke(context.Background(), other.ID)
	stray := waitCSR(t, admin, kubeletCSR(t, env.TokenClient(t, other.Token), "attested-node").Name)
	if !deniedBy(stray, ReasonDenied) || len(stray.Status.Certificate) > 0 ||
		!strings.Contains(conditionMessage(stray), "was given another token than "+other.ID) {
		t.Fatalf("CSR with an unrecorded token: %+v", stray.Status)
	}
	evil := waitCSR(t, admin, kubeletCSR(t, tc, "someone-else").Name)
	if !deniedBy(evil, ReasonDenied) {
		t.Fatalf("CSR for another node: %+v", evil.Status)
	}
	good := waitCSR(t, admin, kubeletCSR(t, tc, "attested-node").Name)
	if !approvedBy(good, ReasonApproved) {
		t.Fatalf("CSR for the attested node: %+v", good.Status)
	}
	block, _ := pem.Decode(good.Status.Certificate)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil || cert.Subject.CommonName != "system:node:attested-node" {
		t.Fatalf("signed certificate %v: %v", cert.Subject, err)
	}
	evs, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
		return e.InvolvedObject.Name == evil.Name && e.Reason == ReasonDenied && strings.Contains(e.Message, "someone-else")
	}) {
		t.Fatal("no event says why the CSR was denied")
	}
}

func conditionMessage(csr *certv1.CertificateSigningRequest) string {
	var b strings.Builder
	for _, c := range csr.Status.Conditions {
		b.WriteString(c.Message)
	}
	return b.String()
}

// leaseTokens reads the token a node's binding Lease records.
type leaseTokens struct{ s *binding.Leases }

func (l leaseTokens) NodeTokenID(ctx context.Context, node string) (string, error) {
	r, err := l.s.Get(ctx, binding.Node, node)
	if errors.Is(err, binding.ErrNotFound) {
		return "", nil
	}
	return r.TokenID, err
}

func approvedBy(csr *certv1.CertificateSigningRequest, reason string) bool {
	return slices.ContainsFunc(csr.Status.Conditions, func(c certv1.CertificateSigningRequestCondition) bool {
		return c.Type == certv1.CertificateApproved && c.Reason == reason
	})
}

func deniedBy(csr *certv1.CertificateSigningRequest, reason string) bool {
	return slices.ContainsFunc(csr.Status.Conditions, func(c certv1.CertificateSigningRequestCondition) bool {
		return c.Type == certv1.CertificateDenied && c.Reason == reason
	})
}

// A token is deleted once its node used it, with the verifier's own
// credential: the real controller-manager signs the kubelet CSR the
// approver approved, then the Node registers, and the reaper deletes the
// token Secret. A token whose node never registers stays.
func TestK8sTokenDeletedOnceUsed(t *testing.T) {
	ctx, env, leases, k := start(t)
	reaped := make(chan struct{}, 4)
	r, err := NewReaper(ReaperConfig{Client: env.Verifier(t), Revoker: k, Resync: time.Second,
		Logger: slog.New(slog.DiscardHandler), OnReaped: func() { reaped <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	go r.Run(ctx)
	admin := env.Admin(t)
	join := func(node, machine string) *token.Grant {
		g, err := k.Mint(ctx, workerReq(node))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leases.Claim(ctx, binding.Node, node, machine); err != nil {
			t.Fatal(err)
		}
		if err := leases.SetToken(ctx, node, machine, g.ID); err != nil {
			t.Fatal(err)
		}
		csr := waitCSR(t, admin, kubeletCSR(t, env.TokenClient(t, g.Token), node).Name)
		if !approvedBy(csr, ReasonApproved) || len(csr.Status.Certificate) == 0 {
			t.Fatalf("%s: CSR not approved and issued: %+v", node, csr.Status)
		}
		return g
	}
	used := join("reaped-node", "tpm-ek:sha256:"+strings.Repeat("21", 32))
	unused := join("never-registers", "tpm-ek:sha256:"+strings.Repeat("22", 32))
	defer k.Revoke(context.Background(), unused.ID)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "reaped-node"}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.CoreV1().Nodes().Delete(context.Background(), "reaped-node", metav1.DeleteOptions{})
	if err := k8stest.SecretGone(ctx, admin, "bootstrap-token-"+used.ID); err != nil {
		t.Fatalf("the used token was not deleted: %v", err)
	}
	select {
	case <-reaped:
	case <-time.After(10 * time.Second):
		t.Fatal("the reaper did not report the deletion")
	}
	if _, err := admin.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+unused.ID, metav1.GetOptions{}); err != nil {
		t.Fatalf("the token of a node that never registered was deleted: %v", err)
	}
}
