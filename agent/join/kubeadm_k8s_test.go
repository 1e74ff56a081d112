//go:build k8s

package join

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/execx"
)

// kubeadmBinary is the real kubeadm: $LATCHKEY_KUBEADM, or the one in
// scripts/k8s/build.sh's cache.
func kubeadmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LATCHKEY_KUBEADM"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../../.cache/k8s/v1.37.2/kubeadm")
	if _, err := os.Stat(p); err != nil {
		t.Skip("no kubeadm binary: run scripts/k8s/build.sh or set LATCHKEY_KUBEADM")
	}
	return p
}

// The real kubeadm accepts the rendered configurations as they are.
func TestK8sKubeadmValidatesRenderedConfig(t *testing.T) {
	kubeadm := kubeadmBinary(t)
	j := newJoiner(t, &execx.Fake{}, func(c *Config) {
		c.DiscoveryTimeout, c.TLSBootstrapTimeout = 30*time.Second, 2*time.Minute
		c.CRISocket = "unix:///run/containerd/containerd.sock"
		c.AdvertiseAddress, c.BindPort = "192.0.2.20", 6443
		c.IgnorePreflightErrors = []string{"Swap"}
	})
	cp := workerTicket()
	cp.ControlPlane, cp.CertificateKey = true, key
	for name, tk := range map[string]Ticket{"worker": workerTicket(), "control-plane": cp} {
		out, err := j.Render(tk)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "join.yaml")
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, err := exec.CommandContext(ctx, kubeadm, "config", "validate", "--config", path).CombinedOutput()
		cancel()
		if err != nil || !strings.Contains(string(res), "ok") {
			t.Fatalf("%s: kubeadm config validate: %v\n%s\n%s", name, err, res, out)
		}
	}
}
