// Package k8stest reaches the real control plane that
// scripts/controlplane.sh up starts, for the tests built with the k8s
// tag (scripts/test-k8s.sh): the env file it writes, clients with the
// administrator's, the verifier's and a bootstrap token's credentials,
// and the CSR a bootstrapping kubelet creates.
//
// Test-only: the shipped binaries must not link it (scripts/test.sh
// checks), and it imports nothing of the product's (only the test-only
// internal/pkitest, for the CSR a kubelet makes, and internal/benchtest,
// for the control plane's CPU time).
package k8stest

import (
	"bufio"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/internal/pkitest"
)

// EnvVar names the env file scripts/test-k8s.sh sets.
const EnvVar = "LATCHKEY_K8S_ENV"

// Env is the env file scripts/controlplane.sh up writes.
type Env map[string]string

// Load reads $LATCHKEY_K8S_ENV, skipping the test when it is unset.
func Load(t testing.TB) Env {
	t.Helper()
	path := os.Getenv(EnvVar)
	if path == "" {
		t.Skip(EnvVar + " not set; run scripts/test-k8s.sh")
	}
	env, err := Parse(path)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// Main runs a package's tests (call it from TestMain). When the control
// plane is up it first calls prepare with the administrator's client
// (deploy.Apply, to install the shipped RBAC), and fails the run if that
// fails.
func Main(m *testing.M, prepare func(ctx context.Context, admin kubernetes.Interface) error) {
	if path := os.Getenv(EnvVar); path != "" {
		if err := prepareEnv(path, prepare); err != nil {
			fmt.Fprintln(os.Stderr, "prepare the control plane:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

func prepareEnv(path string, prepare func(ctx context.Context, admin kubernetes.Interface) error) error {
	env, err := Parse(path)
	if err != nil {
		return err
	}
	c, err := Client(env["LATCHKEY_K8S_ADMIN_KUBECONFIG"])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return prepare(ctx, c)
}

// Parse reads the KEY=value lines of the env file at path.
func Parse(path string) (Env, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := Env{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}

// Client is a client with the credential of kubeconfig, rate limits
// raised for load tests.
func Client(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return kubernetes.NewForConfig(cfg)
}

func (e Env) client(t testing.TB, key string) kubernetes.Interface {
	t.Helper()
	c, err := Client(e[key])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Admin is the cluster administrator (super-admin.conf).
func (e Env) Admin(t testing.TB) kubernetes.Interface {
	return e.client(t, "LATCHKEY_K8S_ADMIN_KUBECONFIG")
}

// Verifier has the narrow credential of verifier/deploy.
func (e Env) Verifier(t testing.TB) kubernetes.Interface {
	return e.client(t, "LATCHKEY_K8S_VERIFIER_KUBECONFIG")
}

// TokenClient authenticates with a bootstrap token, as kubeadm and the
// kubelet do during a join.
func (e Env) TokenClient(t testing.TB, tok string) kubernetes.Interface {
	t.Helper()
	cfg := &rest.Config{
		Host:            "https://" + e["LATCHKEY_K8S_ENDPOINT"],
		BearerToken:     tok,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(e["LATCHKEY_K8S_PKI"], "ca.crt")},
		QPS:             100,
		Burst:           100,
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// SecretGone waits until the kube-system Secret name no longer exists.
func SecretGone(ctx context.Context, c kubernetes.Interface, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// KubeletCSR is the client CSR a kubelet bootstrapping as node creates:
// CN system:node:<node> in system:nodes, for the kubelet client signer,
// with a fresh key.
func KubeletCSR(t testing.TB, node string) *certv1.CertificateSigningRequest {
	t.Helper()
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
		Spec: certv1.CertificateSigningRequestSpec{
			Request: pkitest.CSRPEM(t, &x509.CertificateRequest{
				Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}),
			SignerName: certv1.KubeAPIServerClientKubeletSignerName,
			Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
		},
	}
}
