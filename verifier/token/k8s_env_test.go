//go:build k8s

package token

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/agent/join"
	"github.com/latchkey/latchkey/internal/execx"
)

// k8sEnv is the env file scripts/controlplane.sh up writes.
type k8sEnv map[string]string

// loadK8sEnv reads $LATCHKEY_K8S_ENV, skipping the test when it is unset
// (scripts/test-k8s.sh sets it).
func loadK8sEnv(t testing.TB) k8sEnv {
	t.Helper()
	path := os.Getenv("LATCHKEY_K8S_ENV")
	if path == "" {
		t.Skip("LATCHKEY_K8S_ENV not set; run scripts/test-k8s.sh")
	}
	env, err := parseK8sEnv(path)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func parseK8sEnv(path string) (k8sEnv, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := k8sEnv{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return kubernetes.NewForConfig(cfg)
}

func (e k8sEnv) client(t testing.TB, key string) kubernetes.Interface {
	t.Helper()
	c, err := kubeClient(e[key])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// admin is the cluster administrator (super-admin.conf); verifier is the
// narrow credential of verifier/deploy.
func (e k8sEnv) admin(t testing.TB) kubernetes.Interface {
	return e.client(t, "LATCHKEY_K8S_ADMIN_KUBECONFIG")
}

func (e k8sEnv) verifier(t testing.TB) kubernetes.Interface {
	return e.client(t, "LATCHKEY_K8S_VERIFIER_KUBECONFIG")
}

// tokenClient authenticates with a bootstrap token, as kubeadm and the
// kubelet do during a join.
func (e k8sEnv) tokenClient(t testing.TB, tok string) kubernetes.Interface {
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

func (e k8sEnv) minter(t testing.TB, mod func(*KubeConfig)) *Kube {
	t.Helper()
	cfg := KubeConfig{Client: e.verifier(t), SignatureWait: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	k, err := NewKube(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// recorder keeps the output of every command it runs.
type recorder struct {
	next execx.Runner
	mu   sync.Mutex
	out  strings.Builder
}

func (r *recorder) Run(ctx context.Context, c execx.Cmd) (execx.Result, error) {
	res, err := r.next.Run(ctx, c)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out.Write(res.Stdout)
	r.out.Write(res.Stderr)
	return res, err
}

func (r *recorder) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// dryRunJoin gives the agent's rendered JoinConfiguration for g to the
// real `kubeadm join --dry-run`, and returns kubeadm's output.
func (e k8sEnv) dryRunJoin(t *testing.T, node string, g *Grant, discovery time.Duration) (string, error) {
	t.Helper()
	rec := &recorder{next: execx.New(execx.Config{Logger: slog.New(slog.DiscardHandler)})}
	j, err := join.New(join.Config{
		Runner:                rec,
		Logger:                slog.New(slog.DiscardHandler),
		Kubeadm:               filepath.Join(e["LATCHKEY_K8S_BIN"], "kubeadm"),
		Dir:                   t.TempDir(),
		DiscoveryTimeout:      discovery,
		IgnorePreflightErrors: []string{"all"},
		CRISocket:             "unix:///run/latchkey-test-no-runtime.sock",
		DryRun:                true,
	})
	if err != nil {
		t.Fatal(err)
	}
	tk := join.Ticket{NodeName: node, Endpoints: g.Endpoints, Token: g.Token, CACertHashes: g.CACertHashes, CABundle: g.CABundle}
	ctx, cancel := context.WithTimeout(context.Background(), discovery+time.Minute)
	defer cancel()
	err = j.Join(ctx, tk)
	return rec.output(), err
}
