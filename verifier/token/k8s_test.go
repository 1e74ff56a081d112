//go:build k8s

package token

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/kubernetes/cmd/kubeadm/app/util/pubkeypin"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeadmapi "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm"
	"k8s.io/kubernetes/cmd/kubeadm/app/phases/copycerts"

	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/pkitest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/deploy"
)

// TestMain installs the shipped RBAC, so the tests run with exactly the
// verifier's narrow credential.
func TestMain(m *testing.M) { k8stest.Main(m, deploy.Apply) }

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
	cm, err := env.Admin(t).CoreV1().ConfigMaps("kube-public").Get(context.Background(), "cluster-info", metav1.GetOptions{})
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
	cm, err := env.Admin(t).CoreV1().ConfigMaps("kube-public").Get(context.Background(), "cluster-info", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.ResourceVersion
}

func selfSignedCA(t *testing.T) ([]byte, string) {
	t.Helper()
	ca := pkitest.NewCA(t, "not the cluster")
	return ca.PEM(), pubkeypin.Hash(ca.Cert)
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
	if !slices.Equal(g.CACertHashes, []string{env.Env["LATCHKEY_K8S_CA_HASH"]}) || !slices.Equal(g.Endpoints, []string{env.Env["LATCHKEY_K8S_ENDPOINT"]}) {
		t.Fatalf("grant pins %v endpoints %v, want %s %s", g.CACertHashes, g.Endpoints, env.Env["LATCHKEY_K8S_CA_HASH"], env.Env["LATCHKEY_K8S_ENDPOINT"])
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
		if err := k8stest.SecretGone(context.Background(), env.Admin(t), "bootstrap-token-"+g.ID); err != nil {
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
	c := env.Admin(t)
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
	tc := env.TokenClient(t, g.Token)
	if _, err := tc.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "kubeadm-config", metav1.GetOptions{}); err != nil {
		t.Fatalf("fresh token cannot read kubeadm-config: %v", err)
	}
	// The ticket never reached the agent: the verifier revokes.
	if err := k.Revoke(context.Background(), g.ID); err != nil {
		t.Fatal(err)
	}
	_, err = env.Admin(t).CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-"+g.ID, metav1.GetOptions{})
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
	_, gerr := env.Admin(t).CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-"+minted, metav1.GetOptions{})
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

// A control-plane ticket's certificate key decrypts the uploaded
// certificates with kubeadm's own download-certs code (authenticated as
// the control-plane token, as `kubeadm join --control-plane` is), and the
// garbage collector removes them with the token Secret.
func TestK8sControlPlaneCerts(t *testing.T) {
	env := loadK8sEnv(t)
	k := env.minter(t, func(c *KubeConfig) { c.CertificatesDir = env.Env["LATCHKEY_K8S_PKI"] })
	req := Request{NodeName: "cp-2", Role: latchkeyv1.Role_ROLE_CONTROL_PLANE, EvidenceDigest: testDigest}
	g, err := k.Mint(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	cfg := &kubeadmapi.InitConfiguration{ClusterConfiguration: kubeadmapi.ClusterConfiguration{CertificatesDir: dst}}
	if err := copycerts.DownloadCerts(env.TokenClient(t, g.Token), cfg, g.CertificateKey); err != nil {
		t.Fatalf("kubeadm download-certs: %v", err)
	}
	for _, name := range sharedCerts {
		want, err := os.ReadFile(filepath.Join(env.Env["LATCHKEY_K8S_PKI"], name))
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
	_, err = env.TokenClient(t, w.Token).CoreV1().Secrets("kube-system").Get(context.Background(), "kubeadm-certs", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("worker token reading kubeadm-certs: %v", err)
	}
	// Delete only the token Secret: the garbage collector takes the rest.
	admin := env.Admin(t)
	if err := admin.CoreV1().Secrets("kube-system").Delete(context.Background(), "bootstrap-token-"+g.ID, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k8stest.SecretGone(context.Background(), admin, "kubeadm-certs"); err != nil {
		t.Fatalf("kubeadm-certs outlived its token: %v", err)
	}
}
