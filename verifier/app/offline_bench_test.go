package app_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/benchtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
)

// BenchmarkOfflineUnlock alternates, on one swtpm and in one run, the
// three ways a booting machine gets its disk key, one of each per op:
//
//   - rejoin: an online rejoin through the assembled verifier (TCP and
//     TLS 1.3, EK/AK and quote on swtpm, credential activation,
//     verification, policy, ticket with its offline grant, ack);
//   - offline: the agent's offline unlock of an object sealed for that
//     rejoin's real grant (decode the sealed object, open the TPM,
//     offline.Unseal, close);
//   - clevis: `clevis decrypt` of a tpm2 pin sealed to the same PCRs.
//
// Figures are medians over the ops (the machine is shared and noisy).
// The verifier runs in a process of its own (this test binary again,
// TestOfflineUnlockBenchVerifier), so this process's CPU is the agent's
// alone: rejoin-cpu-ms/op and offline-cpu-ms/op. verifier-cpu-ms/op is
// the verifier process's CPU over all the rejoins per rejoin (a mean:
// /proc counts in 10 ms ticks; it includes the verifier's background
// work meanwhile). Clevis' CPU is its process tree (shell, jose,
// tpm2-tools). swtpm's CPU is in none.
//
//	go test ./verifier/app -run '^$' -bench BenchmarkOfflineUnlock -benchtime 30x
func BenchmarkOfflineUnlock(b *testing.B) {
	u := newOfflineUnlockRig(b)
	var rejoin, off, cl samples
	vcpu0 := u.verifierCPU(b)
	b.ResetTimer()
	for range b.N {
		rejoin.add(u.timeRejoin(b))
		off.add(u.timeOffline(b))
		if u.jwe != nil {
			cl.add(u.sim.ClevisDecrypt(b, u.jwe, u.key))
		}
	}
	b.StopTimer()
	b.ReportMetric(ms(u.verifierCPU(b)-vcpu0)/float64(b.N), "verifier-cpu-ms/op")
	rejoin.report(b, "rejoin")
	off.report(b, "offline")
	b.ReportMetric(ratio(off.wallMedian(), rejoin.wallMedian()), "offline/rejoin-wall")
	b.ReportMetric(ratio(off.cpuMedian(), rejoin.cpuMedian()), "offline/rejoin-cpu")
	if u.jwe != nil {
		cl.report(b, "clevis")
		b.ReportMetric(ratio(off.wallMedian(), cl.wallMedian()), "offline/clevis-wall")
		b.ReportMetric(ratio(off.cpuMedian(), cl.cpuMedian()), "offline/clevis-cpu")
	}
}

// offlineUnlockRig is one swtpm, joined through a verifier whose policy
// grants offline unlock, with the disk key sealed for the grant and, when
// Clevis is installed, the same key in a tpm2 pin on the same PCRs.
type offlineUnlockRig struct {
	sim *tpmtest.Simulator
	// verifier is the pid of the verifier's process.
	verifier int
	client   *ticket.Client
	req      ticket.Request
	key      []byte
	sealed   []byte
	grant    *latchkeyv1.OfflineGrant
	jwe      []byte
}

func newOfflineUnlockRig(b *testing.B) *offlineUnlockRig {
	ctx := context.Background()
	sim := tpmtest.Start(b)
	dir, _ := offlineUnlockFiles(b, sim, benchSalt)
	r := &rig{sim: sim}
	u := &offlineUnlockRig{sim: sim, req: worker()}
	u.verifier, r.addr, r.pin = startVerifierProcess(b, dir)
	u.client = r.agent(b, r.issuer(b), time.Minute)
	// The first join claims the node and disk the timed ops rejoin.
	tk, err := u.client.Get(ctx, u.req)
	if err != nil {
		b.Fatalf("first join: %v", err)
	}
	u.req.Rejoin = true
	u.key, u.grant = tk.GetDiskKey(), tk.GetOfflineGrant()
	if u.grant == nil {
		b.Fatal("the ticket carries no offline grant")
	}
	u.sealed = u.seal(b)
	u.jwe = sim.ClevisEncrypt(b, u.key, pcrIDs(testPCRs))
	return u
}

// benchVerifierEnv names the directory verifierFiles wrote for the
// verifier process; benchReady prefixes the line that process prints
// once it serves: its address and certificate pin.
const (
	benchVerifierEnv = "LATCHKEY_BENCH_VERIFIER_DIR"
	benchReady       = "bench verifier serving: "
	benchSalt        = "bench"
)

// TestOfflineUnlockBenchVerifier is not a test: it is the verifier
// process of BenchmarkOfflineUnlock (the assembled verifier on the files
// verifierFiles wrote), serving until the benchmark closes its stdin, and
// it skips unless that benchmark started it.
func TestOfflineUnlockBenchVerifier(t *testing.T) {
	dir := os.Getenv(benchVerifierEnv)
	if dir == "" {
		t.Skip("the verifier process of BenchmarkOfflineUnlock, run by it alone")
	}
	cfg := &app.Config{Policy: filepath.Join(dir, "policy.yaml"), MasterSecretFile: filepath.Join(dir, "master"),
		ClusterSalt: benchSalt, StateDir: filepath.Join(dir, "state"), AdminSocket: "-"}
	r := startRig(t, nil, cfg)
	fmt.Printf("%s%s %s\n", benchReady, r.addr, r.pin)
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		t.Fatal(err)
	}
}

// startVerifierProcess runs TestOfflineUnlockBenchVerifier on dir in a
// process of its own, stopped when the benchmark ends, and returns its pid
// and where it serves.
func startVerifierProcess(b *testing.B, dir string) (int, string, atls.Pin) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestOfflineUnlockBenchVerifier$", "-test.bench=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), benchVerifierEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		addr, pin, ok := strings.Cut(strings.TrimPrefix(sc.Text(), benchReady), " ")
		if !ok || !strings.HasPrefix(sc.Text(), benchReady) {
			continue
		}
		p, err := atls.ParsePin(pin)
		if err != nil {
			b.Fatal(err)
		}
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
		return cmd.Process.Pid, addr, p
	}
	b.Fatalf("the verifier process ended before serving: %v", sc.Err())
	return 0, "", atls.Pin{}
}

func (u *offlineUnlockRig) verifierCPU(b *testing.B) time.Duration {
	d, err := benchtest.ProcessCPU(u.verifier)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// seal seals the disk key for the grant, as the agent does after a join,
// and keeps it encoded, as the agent stores it.
func (u *offlineUnlockRig) seal(b *testing.B) []byte {
	tp, err := issuer.OpenDevice(u.sim.Device)
	if err != nil {
		b.Fatal(err)
	}
	defer tp.Close()
	s, err := offline.Seal(tp, u.key, u.grant)
	if err != nil {
		b.Fatal(err)
	}
	enc, err := s.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	return enc
}

func (u *offlineUnlockRig) timeRejoin(b *testing.B) (wall, cpu time.Duration) {
	cpu0, start := benchtest.SelfCPU(b), time.Now()
	tk, err := u.client.Get(context.Background(), u.req)
	wall, cpu = time.Since(start), benchtest.SelfCPU(b)-cpu0
	if err != nil || !bytes.Equal(tk.GetDiskKey(), u.key) {
		b.Fatalf("rejoin: %v", err)
	}
	return wall, cpu
}

func (u *offlineUnlockRig) timeOffline(b *testing.B) (wall, cpu time.Duration) {
	cpu0, start := benchtest.SelfCPU(b), time.Now()
	key, err := u.unseal()
	wall, cpu = time.Since(start), benchtest.SelfCPU(b)-cpu0
	if err != nil || !bytes.Equal(key, u.key) {
		b.Fatalf("offline unseal: %v", err)
	}
	return wall, cpu
}

// unseal is the agent's offline unlock (agent/app's tpmSealer.Unseal).
func (u *offlineUnlockRig) unseal() ([]byte, error) {
	var s offline.Sealed
	if err := s.UnmarshalBinary(u.sealed); err != nil {
		return nil, err
	}
	tp, err := issuer.OpenDevice(u.sim.Device)
	if err != nil {
		return nil, err
	}
	defer tp.Close()
	key, _, err := offline.Unseal(tp, &s, u.grant)
	return key, err
}

// pcrIDs is Clevis' spelling of a PCR selection: "0,7,14".
func pcrIDs(pcrs []int) string {
	var b []byte
	for i, p := range pcrs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(p), 10)
	}
	return string(b)
}

// samples are the wall and CPU times of one kind of op.
type samples struct{ wall, cpu []time.Duration }

func (s *samples) add(wall, cpu time.Duration) {
	s.wall, s.cpu = append(s.wall, wall), append(s.cpu, cpu)
}

func (s *samples) wallMedian() time.Duration { return median(s.wall) }
func (s *samples) cpuMedian() time.Duration  { return median(s.cpu) }

func (s *samples) report(b *testing.B, name string) {
	b.ReportMetric(ms(s.wallMedian()), name+"-ms/op")
	b.ReportMetric(ms(s.cpuMedian()), name+"-cpu-ms/op")
}

func median(d []time.Duration) time.Duration {
	sorted := slices.Sorted(slices.Values(d))
	return benchtest.Quantile(sorted, 0.5)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }
