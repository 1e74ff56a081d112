//go:build k8s

package token

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/agent/join"
	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/k8stest"
)

// k8sEnv is the real control plane of scripts/controlplane.sh.
type k8sEnv struct{ k8stest.Env }

// loadK8sEnv skips the test when $LATCHKEY_K8S_ENV is unset
// (scripts/test-k8s.sh sets it).
func loadK8sEnv(t testing.TB) k8sEnv { return k8sEnv{k8stest.Load(t)} }

func (e k8sEnv) minter(t testing.TB, mod func(*KubeConfig)) *Kube {
	t.Helper()
	cfg := KubeConfig{Client: e.Verifier(t), SignatureWait: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	k, err := NewKube(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// unthrottledVerifier is the verifier's credential without client-go's
// client-side rate limit (k8stest's 500 requests/s, burst 1000, is what a
// 10,000-mint benchmark would otherwise measure: two requests a mint).
// The API server's priority and fairness still applies.
func (e k8sEnv) unthrottledVerifier(t testing.TB) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", e.Env["LATCHKEY_K8S_VERIFIER_KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS = -1 // client-go: no rate limiter
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
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
		Kubeadm:               filepath.Join(e.Env["LATCHKEY_K8S_BIN"], "kubeadm"),
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
