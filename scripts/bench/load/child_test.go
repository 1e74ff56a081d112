package load

// The load generator's handle on the verifier process: its files, its
// start, its control channel, and what the kernel says about it.

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/internal/yamltest"
)

// verifierProc is the verifier process started by the load generator.
type verifierProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan string
	logPath string
	addr    string
	pin     atls.Pin
	exited  chan struct{}
}

// writeVerifierFiles writes the policy (the signer's SNP policy, no TPM
// section), a master secret and the config into dir, and returns the
// config's path.
func writeVerifierFiles(tb testing.TB, dir string, s *snptest.Signer) string {
	tb.Helper()
	secret := make([]byte, 32)
	rand.Read(secret)
	defer clear(secret)
	files := map[string]any{
		"policy.yaml": map[string]any{"apiVersion": "latchkey/v1", "snp": s.Policy()},
		"verifier.yaml": map[string]any{
			"listen": "127.0.0.1:0", "policy": filepath.Join(dir, "policy.yaml"),
			"masterSecretFile": filepath.Join(dir, "master-secret"), "clusterSalt": "latchkey-load-bench",
			"stateDir": filepath.Join(dir, "state"), "adminSocket": "-",
			// Every agent here is 127.0.0.1: the per-source bound (256)
			// would refuse a storm's connections at accept, which real
			// fleets (one address per node) never see.
			"limits": map[string]any{"maxConnectionsPerSource": 4096, "maxJoinsInFlight": *flagMaxInFlight},
		},
	}
	for name, v := range files {
		yamltest.Write(tb, filepath.Join(dir, name), v)
	}
	if err := os.WriteFile(filepath.Join(dir, "master-secret"), secret, 0o600); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(dir, "verifier.yaml")
}

// startVerifier re-executes this binary in the verifier role and waits for
// its READY line. The process gets SIGTERM if the generator dies.
func startVerifier(tb testing.TB, dir, configPath string) *verifierProc {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	logPath := filepath.Join(dir, "verifier.log")
	if *flagVerifLog != "" {
		logPath = *flagVerifLog
	}
	p := &verifierProc{logPath: logPath, replies: make(chan string, 16), exited: make(chan struct{})}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close()
	p.cmd = exec.Command(self)
	p.cmd.Env = append(os.Environ(), envRole+"="+roleVerifier, envConfig+"="+configPath)
	p.cmd.Env = append(p.cmd.Env, strings.Fields(*flagVerifEnv)...)
	p.cmd.Stderr = logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := startWithTimerSlack(p.cmd, *flagVerifSlack); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.kill)
	go p.readReplies(stdout)
	if err := p.awaitReady(30 * time.Second); err != nil {
		tb.Fatalf("verifier did not start: %v\n%s", err, p.logTail(20))
	}
	return p
}

func (p *verifierProc) readReplies(stdout io.Reader) {
	defer close(p.exited)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		p.replies <- sc.Text()
	}
	close(p.replies)
}

func (p *verifierProc) awaitReady(limit time.Duration) error {
	line, err := p.reply(limit)
	if err != nil {
		return err
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "READY" {
		return fmt.Errorf("want READY <addr> <pin>, got %q", line)
	}
	p.addr = f[1]
	p.pin, err = atls.ParsePin(f[2])
	return err
}

func (p *verifierProc) reply(limit time.Duration) (string, error) {
	select {
	case line, ok := <-p.replies:
		if !ok {
			return "", errors.New("verifier exited")
		}
		return line, nil
	case <-time.After(limit):
		return "", fmt.Errorf("no answer from the verifier within %s", limit)
	}
}

// command sends one control command and returns its answer line.
func (p *verifierProc) command(cmd string) (string, error) {
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		return "", fmt.Errorf("send %q: %w", cmd, err)
	}
	return p.reply(30 * time.Second)
}

func (p *verifierProc) stats(tb testing.TB) verifierStats {
	tb.Helper()
	line, err := p.command("stats")
	if err != nil {
		tb.Fatal(err)
	}
	return parseStats(tb, line)
}

func parseStats(tb testing.TB, line string) verifierStats {
	tb.Helper()
	js, ok := strings.CutPrefix(line, "STATS ")
	var s verifierStats
	if !ok {
		tb.Fatalf("want a STATS line, got %q", line)
	}
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		tb.Fatalf("verifier stats %q: %v", line, err)
	}
	return s
}

func (p *verifierProc) profile(tb testing.TB, cmd string) {
	tb.Helper()
	if line, err := p.command(cmd); err != nil || line != "OK" {
		tb.Fatalf("%s: %q %v", cmd, line, err)
	}
}

// stop sends SIGTERM, waits for the exit, and returns the final STATS and
// the kernel's rusage of the whole process lifetime.
func (p *verifierProc) stop(tb testing.TB) (verifierStats, *syscall.Rusage) {
	tb.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatal(err)
	}
	line, err := p.reply(90 * time.Second)
	if err != nil {
		tb.Fatalf("verifier stop: %v\n%s", err, p.logTail(20))
	}
	final := parseStats(tb, line)
	p.stdin.Close()
	<-p.exited
	if err := p.cmd.Wait(); err != nil {
		tb.Fatalf("verifier exit: %v\n%s", err, p.logTail(20))
	}
	return final, p.cmd.ProcessState.SysUsage().(*syscall.Rusage)
}

// kill ends a verifier the run did not stop (a failed benchmark).
func (p *verifierProc) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

func (p *verifierProc) logTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// procMemKiB returns VmRSS and VmHWM (peak RSS) from /proc/PID/status.
func procMemKiB(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if k == "VmRSS" {
			rss = n
		} else {
			hwm = n
		}
	}
	return rss, hwm, nil
}

// startWithTimerSlack starts cmd with the given timer slack (0: this
// thread's, normally the kernel's default of 50 µs), as systemd's
// TimerSlackNSec= starts the verifier unit: a process inherits the slack
// of the thread that forks it, keeps it across execve, and every thread it
// creates, the Go runtime's sysmon included, inherits it in turn.
func startWithTimerSlack(cmd *exec.Cmd, slack time.Duration) error {
	if slack <= 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("get timer slack: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack.Nanoseconds()), 0, 0, 0); err != nil {
		return fmt.Errorf("set timer slack: %w", err)
	}
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(old), 0, 0, 0)
	return cmd.Start()
}
