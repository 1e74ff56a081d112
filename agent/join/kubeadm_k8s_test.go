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

	"github.com/latchkey/latchkey/internal/execx/execxtest"
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

// The real kubeadm accepts the rendered configurations as they are: every
// ticket and configuration the byte-for-byte oracles cover
// (oracle_test.go), with the discovery kubeconfig of file discovery
// written where the configuration names it.
func TestK8sKubeadmValidatesRenderedConfig(t *testing.T) {
	kubeadm := kubeadmBinary(t)
	for _, c := range oracleCases() {
		t.Run(c.name, func(t *testing.T) {
			j := newJoiner(t, &execxtest.Fake{}, c.cfg)
			tk := c.tk(t)
			out, err := j.Render(tk)
			if err != nil {
				t.Fatal(err)
			}
			if len(tk.CABundle) > 0 {
				kc, err := discoveryKubeconfig(tk)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(j.discoveryPath(filepath.Join(j.cfg.Dir, "kubeadm-join.yaml")), kc, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(t.TempDir(), "join.yaml")
			if err := os.WriteFile(path, out, 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			res, err := exec.CommandContext(ctx, kubeadm, "config", "validate", "--config", path).CombinedOutput()
			cancel()
			if err != nil || !strings.Contains(string(res), "ok") {
				t.Fatalf("kubeadm config validate: %v\n%s\n%s", err, res, out)
			}
		})
	}
}
