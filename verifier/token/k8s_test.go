//go:build k8s

package token

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"k8s.io/kubernetes/cmd/kubeadm/app/util/pubkeypin"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	kubeadmapi "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm"
	"k8s.io/kubernetes/cmd/kubeadm/app/phases/copycerts"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/deploy"
)

func TestMain(m *testing.M) {
	if path := os.Getenv("LATCHKEY_K8S_ENV"); path != "" {
		if err := applyRBAC(); err != nil {
			fmt.Fprintln(os.Stderr, "apply RBAC:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

func applyRBAC() error {
	env, err := parseK8sEnv(os.Getenv("LATCHKEY_K8S_ENV"))
	if err != nil {
		return err
	}
	c, err := kubeClient(env["LATCHKEY_K8S_ADMIN_KUBECONFIG"])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return deploy.Apply(ctx, c)
}

func secretGone(ctx context.Context, c kubernetes.Interface, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Secrets("kube-system").Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// The default: an authentication-only token and the ticket's CA bundle
// pass the real kubeadm's file discovery, and cluster-info is never
// signed with (or rewritten for) the token.
func TestK8sWorkerJoinFileDiscovery(t *testing.T) {
	env := loadK8sEnv(t)
	k := env.minter(t, nil)
	before := clusterInfoRV(t, env)
	g, err := k.Mint(context.Background(), workerReq("worker-file"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Revoke(context.Background(), g.ID)
	if len(g.CABundle) == 0 {
		t.Fatal("a file-discovery grant carries no CA bundle")
	}
	out, err := env.dryRunJoin(t, "worker-file", g, 20*time.Second)
	t.Logf("kubeadm join --dry-run: err=%v\n%s", err, out)
	if !strings.Contains(out, discoveryOK) {
		t.Fatalf("kubeadm file discovery did not pass with the ticket's bundle (err %v)", err)
	}
	cm, err := env.admin(t).CoreV1().ConfigMaps("kube-public").Get(context.Background(), "cluster-info", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, signed := cm.Data["jws-kubeconfig-"+g.ID]; signed || cm.ResourceVersion != before {
		t.Fatalf("cluster-info changed for an authentication-only token (signed %v, resourceVersion %s -> %s)", signed, before, cm.ResourceVersion)
	}
}

// A ticket whose bundle is not the cluster's CA fails kubeadm's TLS check.
func TestK8sFileDiscoveryWrongBundleRefused(t *testing.T) {
	env := loadK8sEnv(t)
	k := env.minter(t, nil)
	g, err := k.Mint(context.Background(), workerReq("wrong-bundle"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Revoke(context.Background(), g.ID)
	other, pin := selfSignedCA(t)
	g.CABundle, g.CACertHashes = other, []string{pin}
	out, err := env.dryRunJoin(t, "wrong-bundle", g, 10*time.Second)
	if err == nil || !strings.Contains(out, "x509: certificate signed by unknown authority") {
		t.Fatalf("err %v, output:\n%s", err, out)
	}
}

func clusterInfoRV(t *testing.T, env k8sEnv) string {
	t.Helper()
	cm, err := env.admin(t).CoreV1().ConfigMaps("kube-public").Get(context.Background(), "cluster-info", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.ResourceVersion
}

func selfSignedCA(t *testing.T) ([]byte, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not the cluster"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pubkeypin.Hash(c)
}

// Token discovery (kubernetes.discovery: token): a signing token minted
// with the verifier's narrow credential passes the real kubeadm's token
// discovery: token, JWS signature and CA pin.
func TestK8sWorkerJoinDiscovery(t *testing.T) {
	env := loadK8sEnv(t)
	k := env.minter(t, tokenDiscovery)
	g, err := k.Mint(context.Background(), workerReq("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Revoke(context.Background(), g.ID)
	if !slices.Equal(g.CACertHashes, []string{env["LATCHKEY_K8S_CA_HASH"]}) || !slices.Equal(g.Endpoints, []string{env["LATCHKEY_K8S_ENDPOINT"]}) {
		t.Fatalf("grant pins %v endpoints %v, want %s %s", g.CACertHashes, g.Endpoints, env["LATCHKEY_K8S_CA_HASH"], env["LATCHKEY_K8S_ENDPOINT"])
	}
	out, err := env.dryRunJoin(t, "worker-1", g, 20*time.Second)
	t.Logf("kubeadm join --dry-run: err=%v\n%s", err, out)
	if !strings.Contains(out, discoveryOK) {
		t.Fatalf("kubeadm discovery did not validate the token and CA pin (err %v)", err)
	}
}

// discoveryOK is what kubeadm prints once discovery validated the JWS
// signature and the CA pin (visible at -v=1 and above, and implied by the
// phase that follows it).
const discoveryOK = "[preflight] Reading configuration from the \"kubeadm-config\" ConfigMap"

// tokenDiscovery sets a minter up for kubeadm's token discovery.
func tokenDiscovery(c *KubeConfig) { c.TokenDiscovery = true }

// With token discovery, the real kubeadm refuses a wrong CA pin, a deleted
// token and an expired token, each for its own reason.
func TestK8sRefusals(t *testing.T) {
	env := loadK8sEnv(t)
	t.Run("wrong CA hash", func(t *testing.T) {
		k := env.minter(t, tokenDiscovery)
		g, err := k.Mint(context.Background(), workerReq("wrong-pin"))
		if err != nil {
			t.Fatal(err)
		}
		defer k.Revoke(context.Background(), g.ID)
		g.CACertHashes = []string{"sha256:" + strings.Repeat("00", 32)}
		out, err := env.dryRunJoin(t, "wrong-pin", g, 10*time.Second)
		if err == nil || !strings.Contains(out, "none of the public keys") || !strings.Contains(out, "are pinned") {
			t.Fatalf("err %v, output:\n%s", err, out)
		}
	})
	t.Run("deleted token", func(t *testing.T) {
		k := env.minter(t, tokenDiscovery)
		g, err := k.Mint(context.Background(), workerReq("deleted"))
		if err != nil {
			t.Fatal(err)
		}
		if err := k.Revoke(context.Background(), g.ID); err != nil {
			t.Fatal(err)
		}
		waitUnsigned(t, env, g.ID)
		out, err := env.dryRunJoin(t, "deleted", g, 5*time.Second)
		if err == nil || !strings.Contains(out, "could not find a JWS signature in the cluster-info ConfigMap") {
			t.Fatalf("err %v, output:\n%s", err, out)
		}
	})
	t.Run("expired token", func(t *testing.T) {
		k := env.minter(t, func(c *KubeConfig) { c.TokenDiscovery, c.TTL = true, 3*time.Second })
		g, err := k.Mint(context.Background(), workerReq("expired"))
		if err != nil {
			t.Fatal(err)
		}
		// The tokencleaner reaps the expired Secret and the bootstrap
		// signer drops its signature.
		if err := secretGone(context.Background(), env.admin(t), "bootstrap-token-"+g.ID); err != nil {
			t.Fatalf("tokencleaner did not reap the expired token: %v", err)
		}
		waitUnsigned(t, env, g.ID)
		out, err := env.dryRunJoin(t, "expired", g, 5*time.Second)
		if err == nil || !strings.Contains(out, "could not find a JWS signature in the cluster-info ConfigMap") {
			t.Fatalf("err %v, output:\n%s", err, out)
		}
	})
}

// waitUnsigned waits until cluster-info no longer carries id's signature.
func waitUnsigned(t *testing.T, env k8sEnv, id string) {
	t.Helper()
	c := env.admin(t)
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		cm, err := c.CoreV1().ConfigMaps("kube-public").Get(ctx, "cluster-info", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, ok := cm.Data["jws-kubeconfig-"+id]
		return !ok, nil
	})
	if err != nil {
		t.Fatalf("signature of %s still on cluster-info: %v", id, err)
	}
}

// A revoked token is gone and no longer authenticates.
func TestK8sRevokeAfterFailedHandover(t *testing.T) {
	env := loadK8sEnv(t)
	k := env.minter(t, nil)
	g, err := k.Mint(context.Background(), workerReq("handover"))
	if err != nil {
		t.Fatal(err)
	}
	tc := env.tokenClient(t, g.Token)
	if _, err := tc.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "kubeadm-config", metav1.GetOptions{}); err != nil {
		t.Fatalf("fresh token cannot read kubeadm-config: %v", err)
	}
	// The ticket never reached the agent: the verifier revokes.
	if err := k.Revoke(context.Background(), g.ID); err != nil {
		t.Fatal(err)
	}
	_, err = env.admin(t).CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-"+g.ID, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("token secret after revoke: %v", err)
	}
	var last error
	// The API server caches a successful token authentication for 10s
	// (kube-apiserver's token success cache): the revocation takes effect
	// after that.
	err = wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = tc.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubeadm-config", metav1.GetOptions{})
		return apierrors.IsUnauthorized(last), nil
	})
	if err != nil {
		t.Fatalf("revoked token still authenticates after 30s: %v (last answer: %v)", err, last)
	}
}

// A mint whose JWS wait times out deletes its token.
func TestK8sSignatureTimeoutDeletesToken(t *testing.T) {
	env := loadK8sEnv(t)
	var minted string
	k := env.minter(t, func(c *KubeConfig) {
		c.TokenDiscovery = true
		c.SignatureWait = time.Nanosecond
		c.Rand = &recordingRand{id: &minted}
	})
	_, err := k.Mint(context.Background(), workerReq("too-fast"))
	if err == nil {
		t.Skip("the bootstrap signer beat a 1ns deadline")
	}
	if minted == "" {
		t.Fatalf("no token ID drawn: %v", err)
	}
	_, gerr := env.admin(t).CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-"+minted, metav1.GetOptions{})
	if !apierrors.IsNotFound(gerr) {
		t.Fatalf("mint failed (%v) but its token is still there: %v", err, gerr)
	}
}

// recordingRand is crypto/rand that remembers the first token ID drawn.
type recordingRand struct{ id *string }

func (r *recordingRand) Read(p []byte) (int, error) {
	n, err := rand.Read(p)
	if *r.id == "" && len(p) == 2*idLen {
		s, _ := randomString(bytes.NewReader(p), idLen)
		*r.id = s
	}
	return n, err
}

// kubeletCSR makes the CSR a kubelet bootstrapping as node makes.
func kubeletCSR(t *testing.T, c kubernetes.Interface, node string) *certv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certv1.KubeAPIServerClientKubeletSignerName,
			Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
		},
	}
	out, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), csr, metav1.CreateOptions{})
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
	env := loadK8sEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leases, err := binding.NewLeases(binding.LeaseConfig{Client: env.verifier(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewApprover(ApproverConfig{Client: env.verifier(t), Tokens: leaseTokens{leases},
		Logger: slog.New(slog.DiscardHandler), Resync: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go a.Run(ctx)
	k := env.minter(t, nil)
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
	tc := env.tokenClient(t, g.Token)
	admin := env.admin(t)

	// A second token for the same name (its per-node group is right) that
	// the Lease does not record: a leaked group is not enough.
	other, err := k.Mint(ctx, workerReq("attested-node"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Revoke(context.Background(), other.ID)
	stray := waitCSR(t, admin, kubeletCSR(t, env.tokenClient(t, other.Token), "attested-node").Name)
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

// A control-plane ticket's certificate key decrypts the uploaded
// certificates with kubeadm's own download-certs code (authenticated as
// the control-plane token, as `kubeadm join --control-plane` is), and the
// garbage collector removes them with the token Secret.
func TestK8sControlPlaneCerts(t *testing.T) {
	env := loadK8sEnv(t)
	k := env.minter(t, func(c *KubeConfig) { c.CertificatesDir = env["LATCHKEY_K8S_PKI"] })
	req := Request{NodeName: "cp-2", Role: latchkeyv1.Role_ROLE_CONTROL_PLANE, EvidenceDigest: testDigest}
	g, err := k.Mint(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	cfg := &kubeadmapi.InitConfiguration{ClusterConfiguration: kubeadmapi.ClusterConfiguration{CertificatesDir: dst}}
	if err := copycerts.DownloadCerts(env.tokenClient(t, g.Token), cfg, g.CertificateKey); err != nil {
		t.Fatalf("kubeadm download-certs: %v", err)
	}
	for _, name := range sharedCerts {
		want, err := os.ReadFile(filepath.Join(env["LATCHKEY_K8S_PKI"], name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s does not round-trip: %v", name, err)
		}
	}
	// A worker token may not read them.
	w, err := k.Mint(context.Background(), workerReq("not-cp"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Revoke(context.Background(), w.ID)
	_, err = env.tokenClient(t, w.Token).CoreV1().Secrets("kube-system").Get(context.Background(), "kubeadm-certs", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("worker token reading kubeadm-certs: %v", err)
	}
	// Delete only the token Secret: the garbage collector takes the rest.
	admin := env.admin(t)
	if err := admin.CoreV1().Secrets("kube-system").Delete(context.Background(), "bootstrap-token-"+g.ID, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := secretGone(context.Background(), admin, "kubeadm-certs"); err != nil {
		t.Fatalf("kubeadm-certs outlived its token: %v", err)
	}
}

// A token is deleted once its node used it, with the verifier's own
// credential: the real controller-manager signs the kubelet CSR the
// approver approved, then the Node registers, and the reaper deletes the
// token Secret. A token whose node never registers stays.
func TestK8sTokenDeletedOnceUsed(t *testing.T) {
	env := loadK8sEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leases, err := binding.NewLeases(binding.LeaseConfig{Client: env.verifier(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewApprover(ApproverConfig{Client: env.verifier(t), Tokens: leaseTokens{leases},
		Logger: slog.New(slog.DiscardHandler), Resync: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go a.Run(ctx)
	k := env.minter(t, nil)
	reaped := make(chan struct{}, 4)
	r, err := NewReaper(ReaperConfig{Client: env.verifier(t), Revoker: k, Resync: time.Second,
		Logger: slog.New(slog.DiscardHandler), OnReaped: func() { reaped <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	go r.Run(ctx)
	admin := env.admin(t)
	join := func(node, machine string) *Grant {
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
		csr := waitCSR(t, admin, kubeletCSR(t, env.tokenClient(t, g.Token), node).Name)
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
	if err := secretGone(ctx, admin, "bootstrap-token-"+used.ID); err != nil {
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
