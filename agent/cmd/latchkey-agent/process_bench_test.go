package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/sdnotify/sdnotifytest"
)

// buildAgent builds this agent as it ships (static, stripped, without
// gRPC tracing: image/README.md) into a
// temporary directory, for the benchmarks that start it as a process.
func buildAgent(b *testing.B) string {
	b.Helper()
	return goBuild(b, ".", "latchkey-agent")
}

// buildHello builds a static Go hello world the same way: the floor a Go
// process that does nothing costs on this machine.
func buildHello(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	for name, text := range map[string]string{
		"go.mod":  "module hello\n\ngo 1.26\n",
		"main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return goBuild(b, dir, "hello")
}

// goBuild builds the main package in dir as the agent ships.
func goBuild(b *testing.B, dir, name string) string {
	b.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		b.Skipf("no go tool to build %s: %v", name, err)
	}
	bin := filepath.Join(b.TempDir(), name)
	cmd := exec.Command(goTool, "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags=-s -w", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", name, err, out)
	}
	return bin
}

// processRun is one agent process: its wall time from exec to exit, its
// CPU time (user + system) and when each notification arrived after exec.
type processRun struct {
	wall, cpu time.Duration
	notes     []notification
	start     time.Time
}

// since is the time from exec to the first notification with prefix.
func (r processRun) since(b *testing.B, prefix string) time.Duration {
	for _, n := range r.notes {
		if strings.HasPrefix(n.msg, prefix) {
			return n.at.Sub(r.start)
		}
	}
	b.Fatalf("no %q notification in %v", prefix, r.notes)
	return 0
}

// runProcess starts bin with args and NOTIFY_SOCKET set, waits for it and
// collects what it notified.
func runProcess(b *testing.B, bin string, args ...string) processRun {
	b.Helper()
	return runProcessPID(b, nil, bin, args...)
}

// runProcessPID is runProcess telling started, when not nil, the
// process's pid as soon as it runs.
func runProcessPID(b *testing.B, started func(pid int), bin string, args ...string) processRun {
	b.Helper()
	conn, path := sdnotifytest.Listen(b)
	defer conn.Close()
	ch := make(chan notification, 64)
	go collect(conn, ch)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Start()
	if err == nil {
		if started != nil {
			started(cmd.Process.Pid)
		}
		err = cmd.Wait()
	}
	wall := time.Since(start)
	if err != nil {
		b.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	// The process has exited: everything it sent is queued before the marker.
	sendMarker(b, path)
	r := processRun{wall: wall, cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), start: start}
	for n := range ch {
		if n.msg == endMarker {
			break
		}
		r.notes = append(r.notes, n)
	}
	return r
}

// processTotals keeps one binary's runs.
type processTotals struct {
	tpm, attest, ready, wall, cpu, verWall, verCPU []time.Duration
	sched                                          schedTotals
}

// schedTotals keeps, per boot, its threads' CPU and run-queue wait up to
// its first TPM command (tpmRelay), and how many boots it could not read.
type schedTotals struct {
	cpu, wait []time.Duration
	missed    int
}

// bootThroughRelay runs one key-only boot of bin through relay, keeping its
// scheduler statistics at the first TPM command in s.
func bootThroughRelay(b *testing.B, s *schedTotals, relay *tpmRelay, bin string, args []string) processRun {
	relay.mark()
	r := runProcessPID(b, relay.started, bin, args...)
	if st, ok := relay.schedAtFirst(); ok {
		s.cpu, s.wait = append(s.cpu, st.cpu), append(s.wait, st.wait)
	} else {
		s.missed++
	}
	return r
}

// report reports the medians of s, each metric name prefixed.
func (s *schedTotals) report(b *testing.B, prefix string) {
	b.ReportMetric(ms(median(s.cpu)), prefix+"exec-to-tpm-cpu-ms/op")
	b.ReportMetric(ms(median(s.wait)), prefix+"exec-to-tpm-runq-ms/op")
	if s.missed > 0 {
		b.Logf("%sscheduler statistics not read for %d boots (pid not known at the first TPM command)", prefix, s.missed)
	}
}

// add runs one key-only boot and one `version` of bin; relay notes the
// boot's first TPM command.
func (t *processTotals) add(b *testing.B, bin string, args []string, relay *tpmRelay) {
	r := bootThroughRelay(b, &t.sched, relay, bin, args)
	t.tpm = append(t.tpm, relay.since(b, r.start))
	t.attest = append(t.attest, r.since(b, "STATUS=attesting to"))
	t.ready = append(t.ready, r.since(b, "READY=1"))
	t.wall, t.cpu = append(t.wall, r.wall), append(t.cpu, r.cpu)
	v := runProcess(b, bin, "version")
	t.verWall, t.verCPU = append(t.verWall, v.wall), append(t.verCPU, v.cpu)
}

// report reports the medians of t, each metric name prefixed.
func (t *processTotals) report(b *testing.B, prefix string) {
	b.ReportMetric(ms(median(t.tpm)), prefix+"exec-to-tpm-ms/op")
	t.sched.report(b, prefix)
	b.ReportMetric(ms(median(t.attest)), prefix+"exec-to-attest-ms/op")
	b.ReportMetric(ms(median(t.ready)), prefix+"exec-to-ready-ms/op")
	b.ReportMetric(ms(median(t.wall)), prefix+"boot-wall-ms/op")
	b.ReportMetric(ms(median(t.cpu)), prefix+"boot-cpu-ms/op")
	b.ReportMetric(ms(median(t.verWall)), prefix+"version-wall-ms/op")
	b.ReportMetric(ms(median(t.verCPU)), prefix+"version-cpu-ms/op")
}

// keyOnlyBoot is the agent's command line for a key-only boot with no
// join and no re-attestation against the verifier at addr (pinned by
// pin) and the TPM at device, its files in dir.
func keyOnlyBoot(tb testing.TB, dir, addr, pin, device string) []string {
	tb.Helper()
	// The status socket in the test's directory, not the system's.
	conf := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(conf, []byte("statusSocket: "+filepath.Join(dir, "admin.sock")+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return []string{"run", "--config", conf, "--kernel-cmdline", "/dev/null", "--verifier", addr, "--pin", pin,
		"--tpm-device", device, "--node-name", "n1", "--disk-mode", "key-only",
		"--disk-uuid", "6c0e2f5a-4b1d-4e8f-9a3c-2d7b5e1f0a94", "--no-join", "--no-reattest", "--timeout", "20s",
		"--log-level", "error", "--status-file", filepath.Join(dir, "last.json")}
}

// BenchmarkStartToReadyProcess starts the shipped build of the agent as a
// process for a key-only boot against the in-process verifier and swtpm,
// unlike BenchmarkStartToReadyOverhead, which calls run() inside the test
// and so counts neither exec, the runtime's start nor package
// initialisers. The TPM is reached through a relay that notes each
// boot's first TPM command (exec-to-tpm) and the agent's CPU and
// run-queue wait up to it (exec-to-tpm-cpu, exec-to-tpm-runq: the part
// of exec-to-tpm that is the agent's own work, and the part spent
// waiting for a CPU on a shared machine). Each iteration also starts `latchkey-agent version`, the
// process cost of doing nothing, and a static Go hello world, the floor
// of any Go process (hello-* metrics). With LATCHKEY_AGENT_COMPARE set to
// another agent binary (an older build, say), that binary does the same
// alternately in the same run (metrics prefixed compare-), so the two are
// compared under the same load. Every metric is the median of the runs.
func BenchmarkStartToReadyProcess(b *testing.B) {
	bin, hello := buildAgent(b), buildHello(b)
	compare := os.Getenv("LATCHKEY_AGENT_COMPARE")
	sim := tpmtest.Start(b)
	addr, pin := startVerifier(b, sim)
	relay := startTPMRelay(b, strings.TrimPrefix(sim.Device, "tcp://"))
	args := keyOnlyBoot(b, b.TempDir(), addr, pin, "tcp://"+relay.addr)
	var this, other processTotals
	var helloWall, helloCPU []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := runProcess(b, hello)
		helloWall, helloCPU = append(helloWall, h.wall), append(helloCPU, h.cpu)
		this.add(b, bin, args, relay)
		if compare != "" {
			other.add(b, compare, args, relay)
		}
	}
	this.report(b, "")
	b.ReportMetric(ms(median(helloWall)), "hello-wall-ms/op")
	b.ReportMetric(ms(median(helloCPU)), "hello-cpu-ms/op")
	if compare != "" {
		other.report(b, "compare-")
	}
}
