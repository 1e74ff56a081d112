//go:build k8s

package app_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/latchkey/latchkey/agent/reattest"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/logtest"
	"github.com/latchkey/latchkey/internal/yamltest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
	vreattest "github.com/latchkey/latchkey/verifier/reattest"
)

func unattestedTaint(t *testing.T, c kubernetes.Interface, node string) *corev1.Taint {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == kubekey.TaintUnattested {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// waitTaint waits until the node's unattested taint has value want ("" =
// no taint), failing after within.
func waitTaint(t *testing.T, c kubernetes.Interface, node, want string, within time.Duration, logs func() string) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		tt := unattestedTaint(t, c, node)
		if (want == "" && tt == nil) || (tt != nil && tt.Value == want) {
			return time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("node %s: taint %+v after %s, want %q\nlogs:\n%s", node, unattestedTaint(t, c, node), within, want, logs())
	return 0
}

// holdTaint fails if the node's taint changes from want during d.
func holdTaint(t *testing.T, c kubernetes.Interface, node, want string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		tt := unattestedTaint(t, c, node)
		if (want == "" && tt != nil) || (want != "" && (tt == nil || tt.Value != want)) {
			t.Fatalf("node %s: taint %+v, want %q held", node, tt, want)
		}
	}
}

// Continuous re-attestation against the real control plane: a real swtpm
// node runs the agent's re-attestation loop (1s interval) against
// verifier A; verifiers A and B both run the taint controller (one leads).
//
//  1. Attesting, the node stays untainted.
//  2. A PCR extended after boot is tainted "refused" within one interval
//     (plus the controller's resync), and untainted after a reboot
//     (swtpm restart: measurements back).
//  3. A verifier outage shorter than the deadline taints nothing; a node
//     silent past the deadline is tainted "stale".
//  4. Every transition was made once, by one replica: the two never fight.
func TestK8sReattestTaints(t *testing.T) {
	env := k8stest.Load(t)
	admin := env.Admin(t)
	sim := tpmtest.Start(t)
	pol := tpmPolicy(t, sim)
	dir, base := verifierFiles(t, pol, make([]byte, 32), "k8s-reattest")
	// The candidate policy (policyNext) would refuse this node: PCR 14
	// holds another value there.
	tp := pol["tpm"].(tpm.Policy)
	nextPCRs := map[int][]string{}
	for k, v := range tp.PCRs {
		nextPCRs[k] = v
	}
	nextPCRs[14] = []string{strings.Repeat("ab", 32)}
	yamltest.Write(t, filepath.Join(dir, "next.yaml"), map[string]any{"apiVersion": "latchkey/v1",
		"tpm": tpm.Policy{PCRs: nextPCRs, EKCARoots: tp.EKCARoots}})
	const deadline = 8 * time.Second
	mk := func(name string) (*app.Config, *rig) {
		cfg := *base
		cfg.PolicyNext, cfg.StateDir = filepath.Join(dir, "next.yaml"), filepath.Join(dir, "state-"+name)
		cfg.Kubernetes = &app.Kubernetes{Kubeconfig: env["LATCHKEY_K8S_VERIFIER_KUBECONFIG"]}
		cfg.Reattest = app.Reattest{Deadline: app.Duration{Duration: deadline}, Resync: app.Duration{Duration: 300 * time.Millisecond}}
		r := &rig{logs: &logtest.Buffer{}}
		startAssembled(t, r, &cfg, nil)
		return &cfg, r
	}
	_, a := mk("a")
	_, b := mk("b")
	logs := func() string { return "A:\n" + a.logs.String() + "\nB:\n" + b.logs.String() }

	node := "ra-" + time.Now().Format("150405")
	disk := "6c0e2f5a-4b1d-4e8f-9a3c-" + time.Now().Format("150405000000")
	if _, err := admin.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	iss := tpmIssuer(t, sim)
	idr := &idRig{rig: a}
	if tk := idr.join(t, iss, req(node, disk, false, false)); len(tk.DiskKey) != 32 || tk.Token == "" {
		t.Fatal("the join under the enforced policy got no key or token")
	}

	tickets, err := ticket.New(ticket.Config{Endpoints: []string{a.addr}, Pins: []atls.Pin{a.pin}, Issuer: iss,
		Timeout: 5 * time.Second, RefusalBackoff: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	type round struct {
		r   reattest.Result
		err error
	}
	results := make(chan round, 100)
	loop, err := reattest.New(reattest.Config{NodeName: node, DiskUUID: disk, Role: latchkeyv1.Role_ROLE_WORKER,
		Tickets: tickets, Interval: time.Second, RoundTimeout: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnRound: func(_ int, r reattest.Result, err error) { results <- round{r, err} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go loop.Run(ctx)
	next := func(want reattest.Result) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		var seen []string
		for {
			select {
			case r := <-results:
				if r.r == want {
					return
				}
				seen = append(seen, fmt.Sprintf("%s: %v", r.r, r.err))
			case <-timeout:
				t.Fatalf("no %s round in 30s; rounds: %v\n%s", want, seen, logs())
			}
		}
	}

	// 1. Attesting: untainted, and the Lease carries the decision.
	next(reattest.Attested)
	next(reattest.Attested)
	holdTaint(t, admin, node, "", time.Second)
	l, err := admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(), "node-"+node, metav1.GetOptions{})
	if err != nil || l.Annotations[kubekey.AnnotationDecision] != "attested" || !strings.HasPrefix(l.Annotations[kubekey.AnnotationEvidenceDigest], "sha256:") {
		t.Fatalf("node lease %v: %v", l.GetAnnotations(), err)
	}
	// The shadow policy's would-be refusal is recorded; the node keeps its
	// key (above) and stays untainted (held above).
	if l.Annotations[kubekey.AnnotationShadowDecision] != "refused" || l.Annotations[kubekey.AnnotationShadowReason] != "PCR_MISMATCH" {
		t.Fatalf("shadow on the node lease: %v", l.Annotations)
	}

	// 2. A PCR changes after boot: refused, tainted within an interval.
	sim.Extend(t, 14, []byte("runtime measurement"))
	// One interval (1s ±10%), one round, one resync (0.3s), with room for
	// a loaded machine.
	took := waitTaint(t, admin, node, "refused", 5*time.Second, logs)
	t.Logf("tainted refused %s after the PCR was extended", took)
	next(reattest.Refused)
	if tt := unattestedTaint(t, admin, node); tt.Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("effect %s, want NoSchedule", tt.Effect)
	}
	l, _ = admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(), "node-"+node, metav1.GetOptions{})
	if l.Annotations[kubekey.AnnotationReason] != "PCR_MISMATCH" {
		t.Fatalf("lease reason %q, want PCR_MISMATCH", l.Annotations[kubekey.AnnotationReason])
	}
	sim.Restart(t) // a reboot: the measurements are back
	next(reattest.Attested)
	waitTaint(t, admin, node, "", 3*time.Second, logs)

	// 3. Verifier A (the node's) goes down: no taint before the deadline,
	// "stale" after it.
	a.stop()
	down := time.Now()
	holdTaint(t, admin, node, "", deadline/2)
	next(reattest.Unreachable)
	waitTaint(t, admin, node, "stale", deadline+5*time.Second, logs)
	if silent := time.Since(down); silent < deadline-2*time.Second {
		t.Fatalf("tainted stale %s after the last re-attestation, before the %s deadline", silent, deadline)
	}

	// 4. One replica at a time: each transition (refused, removed, stale)
	// was made exactly once across both.
	// Count this node's lines only (other tests' nodes share the cluster).
	all := logs()
	if n := strings.Count(all, `msg="node tainted unattested" component=reattest node=`+node+" "); n != 2 {
		t.Fatalf("%d taint writes, want 2 (refused, stale)\n%s", n, all)
	}
	if n := strings.Count(all, `taint removed" component=reattest node=`+node+"\n"); n != 1 {
		t.Fatalf("%d taint removals, want 1\n%s", n, all)
	}
	el, err := admin.CoordinationV1().Leases(binding.DefaultNamespace).Get(context.Background(), vreattest.DefaultLeaseName, metav1.GetOptions{})
	if err != nil || el.Spec.HolderIdentity == nil || !strings.Contains(b.logs.String(), "re-attestation controller leading") {
		t.Fatalf("election lease %+v (%v): B must lead once A is down\n%s", el, err, all)
	}
}
