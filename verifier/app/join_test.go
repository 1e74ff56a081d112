package app_test

// End-to-end joins in one process against a real swtpm: the verifier as
// serve assembles it (config file, policy file, master secret file, the
// client-go token step on a fake clientset whose bootstrap signer is
// simulated), and the agent's ticket stage with the real TPM issuer.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/cluster-bootstrap/token/jws"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/logtest"
	"github.com/latchkey/latchkey/internal/pkitest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/token"
)

const diskA = "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e"

// testPCRs keeps the quote small; PCR 14 is the one the tests extend.
var testPCRs = []int{0, 7, 14}

type rig struct {
	// bindings replaces the binding store the config would open.
	bindings binding.Store
	// stop stops the verifier startAssembled started (also at cleanup).
	stop   func()
	sim    *tpmtest.Simulator
	addr   string
	pin    atls.Pin
	client *fake.Clientset
	logs   *logtest.Buffer
}

// rigOpts shape the policy the verifier starts with.
type rigOpts struct {
	// ekRoots replaces the simulator's EK CA roots in the policy.
	ekRoots []string
	// metricsListen serves /metrics there.
	metricsListen string
}

func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	sim := tpmtest.Start(t)
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	pol := tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}
	if o.ekRoots != nil {
		pol.EKCARoots = o.ekRoots
	}
	_, cfg := verifierFiles(t, map[string]any{"tpm": pol}, randomSecret(), "test-cluster")
	cfg.MetricsListen = o.metricsListen
	return startRig(t, sim, cfg)
}

func startRig(t testing.TB, sim *tpmtest.Simulator, cfg *app.Config) *rig {
	t.Helper()
	r := &rig{sim: sim, client: signingClientset(t), logs: &logtest.Buffer{}}
	startAssembled(t, r, cfg, fakeSignedMinter(t, r))
	return r
}

// fakeSignedMinter is the client-go token step on r's fake clientset.
func fakeSignedMinter(t testing.TB, r *rig) token.Minter {
	t.Helper()
	minter, err := token.NewKube(token.KubeConfig{Client: r.client, Endpoints: []string{"10.96.0.1:6443"},
		CACertHashes: []string{testClusterCA.pin}, SignatureWait: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(r.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return minter
}

// startAssembled serves cfg as `serve` assembles it on a loopback port; a
// non-nil minter replaces the one cfg's Kubernetes section would build.
func startAssembled(t testing.TB, r *rig, cfg *app.Config, minter token.Minter) {
	t.Helper()
	deps := app.Deps{Logger: slog.New(slog.NewTextHandler(r.logs, nil)), Minter: minter, Bindings: r.bindings}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deps.Listener = lis
	v, err := app.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Serve(ctx) }()
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(r.stop)
	cert, err := app.ServingCertificate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.addr, r.pin = lis.Addr().String(), pinOf(t, cert.Certificate[0])
}

// testClusterCA is the cluster CA the fake cluster-info publishes, as
// kubeadm does: a kubeconfig naming the API server with the CA bundle.
var testClusterCA = newTestClusterCA()

type clusterCA struct {
	pem, clusterInfo, pin string
}

func newTestClusterCA() clusterCA {
	ca := pkitest.NewCA(nil, "kubernetes")
	p := ca.PEM()
	info := "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: https://10.96.0.1:6443\n" +
		"    certificate-authority-data: " + base64.StdEncoding.EncodeToString(p) + "\n"
	return clusterCA{pem: string(p), clusterInfo: info, pin: ca.Pin()}
}

// signingClientset is a fake clientset with a kubeadm-style cluster-info
// and a stand-in for the bootstrap signer: creating a token Secret signs
// cluster-info with it, as kube-controller-manager would.
func signingClientset(t testing.TB) *fake.Clientset {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.ConfigMapClusterInfo, Namespace: metav1.NamespacePublic},
		Data: map[string]string{bootstrapapi.KubeConfigKey: testClusterCA.clusterInfo}}
	c := fake.NewClientset(cm)
	c.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Secret)
		go sign(t, c, string(s.Data[bootstrapapi.BootstrapTokenIDKey]), string(s.Data[bootstrapapi.BootstrapTokenSecretKey]))
		return false, nil, nil
	})
	return c
}

// sign signs cluster-info for the token, once its Secret is stored, as
// the bootstrap signer does: the reactor that started it runs inside the
// Secret's create, and the fake clientset serialises its actions, so the
// Get returns when the create has finished.
func sign(t testing.TB, c *fake.Clientset, id, secret string) {
	if _, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Get(context.Background(),
		bootstrapapi.BootstrapTokenSecretPrefix+id, metav1.GetOptions{}); err != nil {
		t.Errorf("bootstrap signer: token %s: %v", id, err)
		return
	}
	cms := c.CoreV1().ConfigMaps(metav1.NamespacePublic)
	cm, err := cms.Get(context.Background(), bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
	if err != nil {
		t.Error(err)
		return
	}
	sig, err := jws.ComputeDetachedSignature(cm.Data[bootstrapapi.KubeConfigKey], id, secret)
	if err != nil {
		t.Error(err)
		return
	}
	cm.Data[bootstrapapi.JWSSignatureKeyPrefix+id] = sig
	if _, err := cms.Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Error(err)
	}
}

func (r *rig) tokenSecrets(t testing.TB) []corev1.Secret {
	t.Helper()
	l, err := r.client.CoreV1().Secrets(metav1.NamespaceSystem).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func (r *rig) agent(t testing.TB, iss attest.Issuer, timeout time.Duration) *ticket.Client {
	t.Helper()
	return r.agentWith(t, ticket.Config{Issuer: iss, Timeout: timeout})
}

// agentOnce gives up after its first attempt, however long that takes, so
// a refusal test does not depend on the machine's speed.
func (r *rig) agentOnce(t testing.TB, iss attest.Issuer) *ticket.Client {
	t.Helper()
	return r.agentWith(t, ticket.Config{Issuer: iss, Timeout: time.Minute,
		Sleep: func(context.Context, time.Duration) error { return context.Canceled }})
}

func (r *rig) agentWith(t testing.TB, cfg ticket.Config) *ticket.Client {
	t.Helper()
	cfg.Endpoints, cfg.Pins = []string{r.addr}, []atls.Pin{r.pin}
	cfg.InitialBackoff, cfg.MaxBackoff, cfg.RefusalBackoff = 10*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := ticket.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (r *rig) issuer(t testing.TB) *tpmissuer.Issuer {
	t.Helper()
	iss, err := tpmissuer.New(tpmissuer.Config{Device: r.sim.Device, PCRs: testPCRs})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

func worker() ticket.Request {
	return ticket.Request{NodeName: "node-1", DiskUUID: diskA, Role: latchkeyv1.Role_ROLE_WORKER}
}

func TestTPMJoinEndToEnd(t *testing.T) {
	r := newRig(t, rigOpts{})
	c := r.agent(t, r.issuer(t), 30*time.Second)
	first, err := c.Get(context.Background(), worker())
	if err != nil {
		t.Fatal(err)
	}
	if len(first.DiskKey) != 32 || first.Token == "" || first.ApiServerEndpoints[0] != "10.96.0.1:6443" {
		t.Fatalf("ticket: key %d bytes, token set %v, endpoints %v", len(first.DiskKey), first.Token != "", first.ApiServerEndpoints)
	}
	if string(first.CaBundle) != testClusterCA.pem {
		t.Fatalf("ticket CA bundle for file discovery:\n%s\nwant\n%s", first.CaBundle, testClusterCA.pem)
	}
	secrets := r.tokenSecrets(t)
	if len(secrets) != 1 || secrets[0].Name != "bootstrap-token-"+first.Token[:6] {
		t.Fatalf("token secrets %v", secrets)
	}
	again := worker()
	again.Rejoin = true
	second, err := c.Get(context.Background(), again)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.DiskKey, second.DiskKey) || second.Token != "" || len(r.tokenSecrets(t)) != 1 {
		t.Fatal("rejoin: want the same key and no new token")
	}
	log := r.logs.String()
	if strings.Count(log, "result=accepted") != 2 || strings.Contains(log, first.Token[7:]) {
		t.Fatalf("audit log: want two accepted lines and no token secret:\n%s", log)
	}
}

// refusedWith runs one join expecting a refusal with want, and checks no
// token Secret was written and the audit line names the reason.
func (r *rig) refusedWith(t *testing.T, iss attest.Issuer, req ticket.Request, want latchkeyv1.Reason) {
	t.Helper()
	r.refusedWithTokens(t, iss, req, want, 0)
}

// refusedWithTokens is refusedWith on a rig that already holds tokens
// token Secrets from earlier joins.
func (r *rig) refusedWithTokens(t *testing.T, iss attest.Issuer, req ticket.Request, want latchkeyv1.Reason, tokens int) {
	t.Helper()
	_, err := r.agentOnce(t, iss).Get(context.Background(), req)
	var re *ticket.RefusedError
	if !errors.As(err, &re) || re.Reason != want {
		t.Fatalf("err = %v, want refusal %v", err, want)
	}
	if n := len(r.tokenSecrets(t)); n != tokens {
		t.Fatalf("%d token secrets after a refused join, want %d", n, tokens)
	}
	if !strings.Contains(r.logs.String(), "result=refused reason="+want.String()) {
		t.Fatalf("audit log lacks the refusal:\n%s", r.logs)
	}
}

func TestTPMPCRNotInPolicyRefused(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.sim.Extend(t, 14, []byte("unexpected boot component"))
	r.refusedWith(t, r.issuer(t), worker(), latchkeyv1.Reason_PCR_MISMATCH)
}

func TestTPMUntrustedEKCARefused(t *testing.T) {
	other := tpmtest.StartFresh(t)
	r := newRig(t, rigOpts{ekRoots: other.EKCARootsPEM})
	r.refusedWith(t, r.issuer(t), worker(), latchkeyv1.Reason_UNTRUSTED_AK)
}

// wrongAnswer wraps the real issuer and corrupts its activation answer.
type wrongAnswer struct{ attest.Issuer }

func (w wrongAnswer) Attest(ctx context.Context, b []byte) (attest.Attestation, error) {
	a, err := w.Issuer.Attest(ctx, b)
	return corrupt{a}, err
}

type corrupt struct{ attest.Attestation }

func (c corrupt) Respond(ctx context.Context, ch []byte) ([]byte, error) {
	out, err := c.Attestation.Respond(ctx, ch)
	if len(out) > 0 {
		out[len(out)-1] ^= 1
	}
	return out, err
}

func TestTPMWrongActivationAnswerRefused(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.refusedWith(t, wrongAnswer{r.issuer(t)}, worker(), latchkeyv1.Reason_ACTIVATION_FAILED)
}
