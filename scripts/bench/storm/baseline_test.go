package storm

// The baseline: the price of attestation is the difference between the
// storm and the same nodes joining the way a plain kubeadm cluster does,
// with one bootstrap token made in advance (`kubeadm token create`'s
// Secret: kubeadm's default-node-token group, which kubeadm's RBAC lets
// kube-controller-manager's csrapproving controller approve for), no
// verifier and no attestation. Same control plane, same controller-manager
// flags, same kubelet part (kubeletBootstrap), same number of nodes.

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchkey/latchkey/internal/benchtest"
	"github.com/latchkey/latchkey/internal/k8stest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

var flagBaseline = flag.Bool("storm.baseline", false,
	"after the storm, the same number of nodes join with one kubeadm token made in advance, CSRs approved by the controller-manager's csrapproving controller")

// kubeadmNodeGroup is the group kubeadm puts its node tokens in; its RBAC
// (the kubeadm:node-autoapprove-bootstrap binding) lets the csrapproving
// controller approve their kubelets' client CSRs.
const kubeadmNodeGroup = "system:bootstrappers:kubeadm:default-node-token"

// baseline is what the baseline storm measured.
type baseline struct {
	nodes           int
	joins           []joined // start, cert (CSR issued), done (Node Ready)
	failed          int
	firstErr        error
	wall            time.Duration
	controlPlaneCPU map[string]time.Duration
	generatorCPU    time.Duration
	requests        map[string]float64
}

// runBaseline joins n nodes named storm-<run>-base-<i> with one kubeadm
// token, all at once, and deletes the token and the Nodes after.
func runBaseline(b *testing.B, env k8stest.Env, run string, n int) *baseline {
	admin := env.Admin(b)
	id, secret := randomString(b, 6), randomString(b, 16)
	tokenSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: "kube-system"},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": id, "token-secret": secret,
			"expiration":                     time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
			"auth-extra-groups": kubeadmNodeGroup, "description": "latchkey storm baseline",
		},
	}
	if _, err := admin.CoreV1().Secrets("kube-system").Create(context.Background(), tokenSecret, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	defer admin.CoreV1().Secrets("kube-system").Delete(context.Background(), tokenSecret.Name, metav1.DeleteOptions{})
	ca, err := os.ReadFile(filepath.Join(env["LATCHKEY_K8S_PKI"], "ca.crt"))
	if err != nil {
		b.Fatal(err)
	}
	tk := &latchkeyv1.Ticket{ApiServerEndpoints: []string{env["LATCHKEY_K8S_ENDPOINT"]}, CaBundle: ca, Token: id + "." + secret}
	nodes := make([]*node, n)
	for i := range nodes {
		nodes[i] = &node{kind: "base", name: fmt.Sprintf("storm-%s-base-%d", run, i)}
	}
	r := &baseline{nodes: n}
	ctx, cancel := context.WithTimeout(context.Background(), *flagTimeout)
	defer cancel()
	req0 := apiRequests(b, admin)
	cp0, self0 := env.CPU(b), benchtest.SelfCPU(b)
	r.joins, r.failed, r.firstErr, r.wall = joinAtOnce(nodes, func(nd *node, start time.Time) (joined, error) {
		j := joined{kind: "base", start: time.Since(start)}
		j.ticket = j.start // no ticket: the token was made in advance
		_, err := kubeletBootstrap(ctx, tk, nd.name, func() { j.cert = time.Since(start) }, func() { j.waits++ })
		j.done = time.Since(start)
		return j, err
	})
	cp1, self1 := env.CPU(b), benchtest.SelfCPU(b)
	r.requests = requestsSince(req0, apiRequests(b, admin))
	r.generatorCPU = self1 - self0
	r.controlPlaneCPU = map[string]time.Duration{}
	for k := range cp1 {
		r.controlPlaneCPU[k] = cp1[k] - cp0[k]
	}
	deleteNodes(admin, nodes)
	return r
}

const tokenChars = "0123456789abcdefghijklmnopqrstuvwxyz"

// randomString is n characters of [a-z0-9], as a bootstrap token's parts.
func randomString(b *testing.B, n int) string {
	buf := make([]byte, n)
	if _, err := rand.Read(buf); err != nil {
		b.Fatal(err)
	}
	for i := range buf {
		buf[i] = tokenChars[int(buf[i])%len(tokenChars)]
	}
	return string(buf)
}

func (r *baseline) rate() float64 { return float64(len(r.joins)) / r.wall.Seconds() }

// cpuPerJoin is the control plane's CPU per join (verifier: the
// verifier's, zero for the baseline).
func cpuPerJoin(cp map[string]time.Duration, verifier time.Duration, joins int) time.Duration {
	t := verifier
	for _, c := range k8stest.Components {
		t += cp[c]
	}
	return t / time.Duration(max(joins, 1))
}

// printBaseline prints the baseline and its comparison with the storm.
func printBaseline(w io.Writer, s *result, r *baseline) {
	var whole []time.Duration
	for _, j := range r.joins {
		whole = append(whole, j.done-j.start)
	}
	fmt.Fprintf(w, "\nbaseline (kubeadm token made in advance, CSRs approved by kube-controller-manager's csrapproving, no verifier): %d nodes at once\n", r.nodes)
	fmt.Fprintf(w, "baseline: joined %d, failed %d, in %s: %.1f whole joins/s; whole join p50 %s p99 %s; kubelets that waited for their token: %d\n",
		len(r.joins), r.failed, r.wall.Round(time.Millisecond), r.rate(), ms(pct(whole, .5)), ms(pct(whole, .99)), waitedJoins(r.joins))
	n := float64(max(len(r.joins), 1))
	fmt.Fprint(w, "baseline CPU per join:")
	for _, c := range k8stest.Components {
		fmt.Fprintf(w, " %s %.2f ms,", c, float64(r.controlPlaneCPU[c].Microseconds())/1000/n)
	}
	fmt.Fprintf(w, " kubelets %.2f ms\n", float64(r.generatorCPU.Microseconds())/1000/n)
	storm := float64(len(s.joins)) / s.wall.Seconds()
	base := cpuPerJoin(r.controlPlaneCPU, 0, len(r.joins))
	lk := cpuPerJoin(s.controlPlaneCPU, s.verifierCPU, len(s.joins))
	fmt.Fprintf(w, "price of attestation: whole joins/s latchkey %.1f / baseline %.1f = %.2f (target >= 0.8: %s); control plane + verifier CPU per join latchkey %.2f ms, baseline %.2f ms: %.2f ms more (verifier %.2f ms of it)\n",
		storm, r.rate(), storm/r.rate(), verdict(storm/r.rate() >= 0.8),
		float64(lk.Microseconds())/1000, float64(base.Microseconds())/1000, float64((lk-base).Microseconds())/1000,
		float64(s.verifierCPU.Microseconds())/1000/float64(max(len(s.joins), 1)))
	printRequests(w, s.requests, len(s.joins), r.requests, len(r.joins))
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}
