package k8stest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/benchtest"
)

// Components are the control-plane processes scripts/controlplane.sh
// starts, by the name of their pid file in LATCHKEY_K8S_DIR.
var Components = []string{"etcd", "kube-apiserver", "kube-controller-manager"}

// CPU returns the user+system CPU time each control-plane component has
// used so far (from /proc, the kernel's accounting of the process and its
// direct children: benchtest.TreeCPU), so a benchmark can say where the
// time of a run went: the difference of two calls is the CPU of what
// happened in between. It fails the benchmark when a component cannot
// be read.
func (e Env) CPU(tb testing.TB) map[string]time.Duration {
	tb.Helper()
	out := map[string]time.Duration{}
	for _, name := range Components {
		b, err := os.ReadFile(filepath.Join(e["LATCHKEY_K8S_DIR"], name+".pid"))
		if err != nil {
			tb.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			tb.Fatalf("%s.pid: %v", name, err)
		}
		d, err := benchtest.TreeCPU(pid)
		if err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
		out[name] = d
	}
	return out
}
