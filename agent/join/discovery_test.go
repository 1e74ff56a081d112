package join

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/execx/execxtest"
	"github.com/latchkey/latchkey/internal/pkitest"
)

// testCA is a CA certificate (PEM) and its kubeadm-style pin.
func testCA(t *testing.T, name string) (pemBytes []byte, pin string) {
	t.Helper()
	ca := pkitest.NewCA(t, name)
	return ca.PEM(), ca.Pin()
}

func fileTicket(t *testing.T) Ticket {
	t.Helper()
	ca, pin := testCA(t, "kubernetes")
	tk := workerTicket()
	tk.CACertHashes, tk.CABundle = []string{pin}, ca
	return tk
}

func TestRenderFileDiscovery(t *testing.T) {
	j := newJoiner(t, &execxtest.Fake{}, nil)
	out, err := j.Render(fileTicket(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"file:\n    kubeConfigPath: ", "-discovery.conf", "tlsBootstrapToken: abcdef.0123456789abcdef"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("rendered config lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "bootstrapToken:") {
		t.Fatalf("file discovery must not use token discovery:\n%s", out)
	}
	red, err := j.RenderRedacted(fileTicket(t))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(red), "0123456789abcdef") || !strings.Contains(string(red), "tlsBootstrapToken: abcdef."+Redacted) {
		t.Fatalf("redacted config shows the token secret:\n%s", red)
	}
}

// A bundle is accepted only if every certificate in it is pinned.
func TestRenderRefusesUnpinnedBundle(t *testing.T) {
	j := newJoiner(t, &execxtest.Fake{}, nil)
	tk := fileTicket(t)
	extra, extraPin := testCA(t, "rogue")
	tk.CABundle = append(tk.CABundle, extra...)
	_, err := j.Render(tk)
	if err == nil || !strings.Contains(err.Error(), `ticket CA bundle holds "rogue" (`+extraPin+"), which no CA cert hash pins") {
		t.Fatalf("err = %v", err)
	}
	tk = fileTicket(t)
	tk.CABundle = []byte("not pem")
	if _, err := j.Render(tk); err == nil || !strings.Contains(err.Error(), "ticket CA bundle") {
		t.Fatalf("garbage bundle: %v", err)
	}
}

// Join writes the discovery kubeconfig (0600, the endpoint and the
// bundle, no credentials) next to the configuration and removes both.
func TestJoinWritesAndRemovesDiscoveryKubeconfig(t *testing.T) {
	tk := fileTicket(t)
	var discovery string
	runner := runnerFunc(func(ctx context.Context, c execx.Cmd) (execx.Result, error) {
		cfgPath := c.Args[2]
		discovery = strings.TrimSuffix(cfgPath, ".yaml") + "-discovery.conf"
		st, err := os.Stat(discovery)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("discovery kubeconfig %v mode %v", err, st)
		}
		kc, err := clientcmd.LoadFromFile(discovery)
		if err != nil {
			t.Fatal(err)
		}
		cl := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster]
		user := kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]
		noCreds := user != nil && user.Token == "" && user.TokenFile == "" && len(user.ClientKeyData) == 0 && user.ClientKey == ""
		if cl.Server != "https://10.0.0.1:6443" || string(cl.CertificateAuthorityData) != string(tk.CABundle) || !noCreds {
			t.Errorf("discovery kubeconfig: server %q, bundle match %v, user without credentials %v", cl.Server,
				string(cl.CertificateAuthorityData) == string(tk.CABundle), noCreds)
		}
		cfg, _ := os.ReadFile(cfgPath)
		if !strings.Contains(string(cfg), "kubeConfigPath: "+discovery) {
			t.Errorf("JoinConfiguration does not name %s:\n%s", discovery, cfg)
		}
		return execx.Result{}, nil
	})
	if err := newJoiner(t, runner, nil).Join(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(discovery); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("discovery kubeconfig left behind: %v", err)
	}
}

type runnerFunc func(context.Context, execx.Cmd) (execx.Result, error)

func (f runnerFunc) Run(ctx context.Context, c execx.Cmd) (execx.Result, error) { return f(ctx, c) }
