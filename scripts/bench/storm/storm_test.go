package storm

import (
	"context"
	"crypto/rand"
	"crypto/sha512"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	snpissuer "github.com/latchkey/latchkey/attest/snp/issuer"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/benchtest"
	"github.com/latchkey/latchkey/internal/k8stest"
	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/yamltest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/token"
)

// envBench must be set for BenchmarkStorm to run, so `go test -bench .
// ./...` never starts a storm by accident.
const envBench = "LATCHKEY_STORM_BENCH"

var (
	flagSNP      = flag.Int("storm.snp", 500, "SEV-SNP agents (go-sev-guest test signer, each its own chip)")
	flagTPM      = flag.Int("storm.tpm", 4, "swtpm TPM agents")
	flagVerifier = flag.String("storm.verifier", "", "the latchkey-verifier binary (required)")
	flagInFlight = flag.Int("storm.max-in-flight", 0, "the verifier's limits.maxJoinsInFlight (0: its default)")
	flagQPS      = flag.Float64("storm.kube-qps", 0, "the verifier's kubernetes.apiQPS (burst twice that; 0: its default)")
	flagTimeout  = flag.Duration("storm.timeout", 5*time.Minute, "bound on every join together")
	flagReapWait = flag.Duration("storm.reap-wait", 2*time.Minute, "how long to wait after the storm for the tokens to fall to zero")
)

// testPCRs are the PCRs the TPM agents quote (as verifier/app's tests).
var testPCRs = []int{0, 7, 14}

// BenchmarkStorm is the whole-join boot storm (package doc). It runs once
// whatever b.N is (scripts/bench-storm.sh passes -test.benchtime=1x). It
// fails when a join fails; the figures are reported, never asserted.
func BenchmarkStorm(b *testing.B) {
	if os.Getenv(envBench) == "" {
		b.Skip("set " + envBench + "=1 to run the storm (scripts/bench-storm.sh does)")
	}
	if *flagVerifier == "" {
		b.Fatal("-storm.verifier names no latchkey-verifier binary")
	}
	env := k8stest.Load(b)
	r := runStorm(b, env)
	r.print(os.Stdout)
	r.report(b)
	if r.failed > 0 {
		b.Fatalf("%d of %d joins failed; the first: %v", r.failed, len(r.joins)+r.failed, r.firstErr)
	}
	if *flagBaseline {
		base := runBaseline(b, env, fmt.Sprintf("%x", time.Now().Unix()%0xfffff), r.agents)
		printBaseline(os.Stdout, r, base)
		b.ReportMetric(base.rate(), "baseline-joins/s")
		if base.failed > 0 {
			b.Fatalf("baseline: %d of %d joins failed; the first: %v", base.failed, base.nodes, base.firstErr)
		}
	}
}

// node is one agent: its machine, its names and its ticket client.
type node struct {
	kind   string // "snp" or "tpm"
	name   string
	disk   string
	issuer attest.Issuer
	client *ticket.Client
}

// joined is one whole join's timings, from the storm's start.
type joined struct {
	kind                      string
	start, ticket, cert, done time.Duration
	// waits is how often its kubelet waited for the API server to know
	// its token (kubeletBootstrap).
	waits int
}

func runStorm(b *testing.B, env k8stest.Env) *result {
	dir := b.TempDir()
	run := fmt.Sprintf("%x", time.Now().Unix()%0xfffff)
	quiet := slog.New(slog.DiscardHandler)

	base := snptest.New(b)
	sims := tpmtest.StartSiblings(b, *flagTPM)
	pol := map[string]any{"apiVersion": "latchkey/v1", "snp": base.Policy()}
	if len(sims) > 0 {
		ref, err := tpmissuer.Measure(context.Background(), sims[0].Device, testPCRs)
		if err != nil {
			b.Fatal(err)
		}
		pol["tpm"] = tpm.Policy{PCRs: ref.PCRs, EKCARoots: sims[0].EKCARootsPEM}
	}
	addr := freePort(b)
	cfgPath := writeVerifierFiles(b, dir, addr, env, pol)
	pin := verifierPin(b, cfgPath)

	nodes := make([]*node, 0, *flagSNP+len(sims))
	nodes = append(nodes, snpNodes(b, run, *flagSNP, quiet)...)
	for i, s := range sims {
		iss, err := tpmissuer.New(tpmissuer.Config{Device: s.Device, PCRs: testPCRs})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { iss.Close() })
		nodes = append(nodes, &node{kind: "tpm", name: fmt.Sprintf("storm-%s-tpm-%d", run, i), disk: uuid.NewString(), issuer: iss})
	}
	r := &result{agents: len(nodes), snp: *flagSNP, tpm: len(sims)}
	for _, n := range nodes {
		c, err := ticket.New(ticket.Config{
			Endpoints: []string{addr}, Pins: []atls.Pin{pin}, Issuer: n.issuer,
			Timeout: *flagTimeout, AttemptTimeout: time.Minute,
			InitialBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second, RefusalBackoff: time.Second,
			Logger: quiet, OnAttemptFailed: func(error) { r.retried.Add(1) },
		})
		if err != nil {
			b.Fatal(err)
		}
		n.client = c
	}

	admin := env.Admin(b)
	v := startVerifier(b, dir, cfgPath, addr)
	r.tokensBefore = liveTokens(b, admin)
	req0 := apiRequests(b, admin)
	cp0, v0, self0 := env.CPU(b), v.cpu(b), benchtest.SelfCPU(b)

	ctx, cancel := context.WithTimeout(context.Background(), *flagTimeout)
	defer cancel()
	r.joins, r.failed, r.firstErr, r.wall = joinAtOnce(nodes, func(n *node, start time.Time) (joined, error) {
		return wholeJoin(ctx, n, start)
	})
	cp1, v1, self1 := env.CPU(b), v.cpu(b), benchtest.SelfCPU(b)
	r.verifierCPU, r.generatorCPU = v1-v0, self1-self0
	r.controlPlaneCPU = map[string]time.Duration{}
	for k := range cp1 {
		r.controlPlaneCPU[k] = cp1[k] - cp0[k]
	}

	// The tokens left when the last join is done, then until none is.
	r.tokensAtEnd = liveTokens(b, admin)
	r.tokensZero = -1
	for t0 := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		n := liveTokens(b, admin)
		r.tokenCurve = append(r.tokenCurve, tokenSample{at: time.Since(t0), alive: n})
		if n <= r.tokensBefore {
			r.tokensZero = time.Since(t0)
			break
		}
		if time.Since(t0) > *flagReapWait {
			break
		}
	}
	r.tokensLeft = r.tokenCurve[len(r.tokenCurve)-1].alive
	// The requests of the storm and its tokens' reaping (the reaper's last
	// records may be cleared a moment later).
	r.requests = requestsSince(req0, apiRequests(b, admin))
	// The reaper clears a record after deleting its token: wait for that
	// too (a moment after the last deletion).
	for t0 := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		r.recordsNamingTokens = recordsNamingTokens(b, admin, nodes)
		if r.recordsNamingTokens == 0 || time.Since(t0) > *flagReapWait {
			break
		}
	}
	r.verifierTotal, r.verifierRSSKiB = v.stop(b)
	r.reaped = v.countLog(b, "bootstrap token deleted after use")
	deleteNodes(admin, nodes)
	return r
}

// chipID is agent i's CHIP_ID: 64 bytes, its own per run.
func chipID(run string, i int) []byte {
	sum := sha512.Sum512([]byte(fmt.Sprintf("latchkey storm %s chip %d", run, i)))
	return sum[:]
}

// snpNodes makes n SNP agents, each its own chip (its own VCEK under the
// same fake AMD roots, so one policy trusts them all).
func snpNodes(b *testing.B, run string, n int, log *slog.Logger) []*node {
	out := make([]*node, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	var first benchtest.FirstError
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s := snptest.NewWithOptions(b, snptest.Options{ChipID: chipID(run, i)})
			iss, err := snpissuer.New(snpissuer.Config{QuoteProvider: s.QuoteProvider(), Logger: log})
			if err != nil {
				first.Set(err)
				return
			}
			out[i] = &node{kind: "snp", name: fmt.Sprintf("storm-%s-snp-%d", run, i), disk: uuid.NewString(), issuer: iss}
		})
	}
	wg.Wait()
	if err := first.Err(); err != nil {
		b.Fatal(err)
	}
	return out
}

// wholeJoin is one node's join: the ticket, then the kubelet's TLS
// bootstrap with its token and the Node's registration.
func wholeJoin(ctx context.Context, n *node, start time.Time) (joined, error) {
	j := joined{kind: n.kind, start: time.Since(start)}
	tk, err := n.client.Get(ctx, ticket.Request{NodeName: n.name, DiskUUID: n.disk, Role: latchkeyv1.Role_ROLE_WORKER})
	if err != nil {
		return j, fmt.Errorf("ticket: %w", err)
	}
	clear(tk.DiskKey)
	j.ticket = time.Since(start)
	issued, err := kubeletBootstrap(ctx, tk, n.name, func() { j.cert = time.Since(start) }, func() { j.waits++ })
	if err != nil {
		return j, err
	}
	_ = issued
	j.done = time.Since(start)
	return j, nil
}

func freePort(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// writeVerifierFiles writes the policy, a master secret and the config
// (Kubernetes mode with the verifier's narrow credential) into dir.
func writeVerifierFiles(b *testing.B, dir, addr string, env k8stest.Env, pol map[string]any) string {
	secret := make([]byte, 32)
	rand.Read(secret)
	defer clear(secret)
	kube := map[string]any{"kubeconfig": env["LATCHKEY_K8S_VERIFIER_KUBECONFIG"]}
	if *flagQPS != 0 {
		kube["apiQPS"] = *flagQPS
	}
	files := map[string]any{
		"policy.yaml": pol,
		"verifier.yaml": map[string]any{
			"listen": addr, "policy": filepath.Join(dir, "policy.yaml"),
			"masterSecretFile": filepath.Join(dir, "master-secret"), "clusterSalt": "latchkey-storm",
			"stateDir": filepath.Join(dir, "state"), "adminSocket": "-",
			// Every agent here is 127.0.0.1: the per-source bound would
			// refuse a storm's connections at accept, which real fleets
			// (one address per node) never see.
			"limits":     map[string]any{"maxConnectionsPerSource": 4096, "maxJoinsInFlight": *flagInFlight},
			"kubernetes": kube,
		},
	}
	for name, v := range files {
		yamltest.Write(b, filepath.Join(dir, name), v)
	}
	if err := os.WriteFile(filepath.Join(dir, "master-secret"), secret, 0o600); err != nil {
		b.Fatal(err)
	}
	return filepath.Join(dir, "verifier.yaml")
}

// verifierPin is what `latchkey-verifier pin` prints for the config (it
// creates the serving certificate the server then loads).
func verifierPin(b *testing.B, cfgPath string) atls.Pin {
	out, err := exec.Command(*flagVerifier, "pin", "--config", cfgPath).Output()
	if err != nil {
		b.Fatalf("latchkey-verifier pin: %v", err)
	}
	p, err := atls.ParsePin(strings.TrimSpace(string(out)))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// verifierProc is the latchkey-verifier serve process.
type verifierProc struct {
	cmd     *exec.Cmd
	logPath string
}

func startVerifier(b *testing.B, dir, cfgPath, addr string) *verifierProc {
	v := &verifierProc{logPath: filepath.Join(dir, "verifier.log")}
	logFile, err := os.Create(v.logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	v.cmd = exec.Command(*flagVerifier, "serve", "--config", cfgPath)
	v.cmd.Stdout, v.cmd.Stderr = logFile, logFile
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := v.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if v.cmd.ProcessState == nil {
			v.cmd.Process.Kill()
			v.cmd.Wait()
		}
	})
	// The storm starts once the verifier listens and its approver and
	// reaper say their informers have listed ("informers synced", one
	// line each), so the first CSRs do not wait on a resync.
	for t0 := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if listens(addr) && v.countLog(b, "informers synced") >= 2 {
			break
		}
		if time.Since(t0) > 30*time.Second {
			b.Fatalf("the verifier does not listen on %s with its informers synced:\n%s", addr, v.logTail(20))
		}
	}
	return v
}

func listens(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

func (v *verifierProc) cpu(b *testing.B) time.Duration {
	d, err := benchtest.TreeCPU(v.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// stop sends SIGTERM and returns the process's whole CPU time and peak
// RSS from the kernel's rusage.
func (v *verifierProc) stop(b *testing.B) (time.Duration, int64) {
	v.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- v.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		v.cmd.Process.Kill()
		<-done
		b.Fatalf("the verifier did not stop on SIGTERM:\n%s", v.logTail(20))
	}
	ru := v.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Maxrss
}

func (v *verifierProc) countLog(b *testing.B, msg string) int {
	data, err := os.ReadFile(v.logPath)
	if err != nil {
		b.Fatal(err)
	}
	return strings.Count(string(data), msg)
}

func (v *verifierProc) logTail(n int) string {
	data, _ := os.ReadFile(v.logPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// liveTokens counts latchkey's token Secrets (the administrator's view;
// metadata of a label-selected list, never a secret printed).
func liveTokens(b *testing.B, admin kubernetes.Interface) int {
	l, err := admin.CoreV1().Secrets("kube-system").List(context.Background(), metav1.ListOptions{LabelSelector: token.ManagedSelector})
	if err != nil {
		b.Fatal(err)
	}
	return len(l.Items)
}

// recordsNamingTokens counts the storm's node binding Leases that still
// name a token (the reaper clears a used one).
func recordsNamingTokens(b *testing.B, admin kubernetes.Interface, nodes []*node) int {
	l, err := admin.CoordinationV1().Leases(binding.DefaultNamespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: kubekey.LabelBinding + "=" + string(binding.Node)})
	if err != nil {
		b.Fatal(err)
	}
	ours := map[string]bool{}
	for _, n := range nodes {
		ours[binding.ObjectName(binding.Node, n.name)] = true
	}
	c := 0
	for _, lease := range l.Items {
		if ours[lease.Name] && lease.Annotations[kubekey.AnnotationTokenID] != "" {
			c++
		}
	}
	return c
}

// deleteNodes removes the storm's Nodes (the control plane is the
// script's own; its CSRs are garbage-collected by the controller-manager).
func deleteNodes(admin kubernetes.Interface, nodes []*node) {
	work := make(chan string)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for name := range work {
				admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
			}
		})
	}
	for _, n := range nodes {
		work <- n.name
	}
	close(work)
	wg.Wait()
}

// joinAtOnce starts join for every node at the same instant (the
// goroutines wait on one gate) and collects what they return: the joins
// that succeeded, how many failed and the first failure, and the wall time
// from the gate's opening to the last join's end. start, passed to join,
// is that opening.
func joinAtOnce(nodes []*node, join func(n *node, start time.Time) (joined, error)) (joins []joined, failed int, firstErr error, wall time.Duration) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var start time.Time
	for _, n := range nodes {
		wg.Go(func() {
			<-gate
			j, err := join(n, start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", n.name, err)
				}
				return
			}
			joins = append(joins, j)
		})
	}
	start = time.Now()
	close(gate)
	wg.Wait()
	return joins, failed, firstErr, time.Since(start)
}
