package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/exitcode"
)

// TestMain lets a test run this package's main as a real process: the
// exit code and the timing are then the binary's, not a function's.
func TestMain(m *testing.M) {
	if os.Getenv("LATCHKEY_AGENT_TEST_MAIN") == "1" {
		main()
	}
	os.Exit(m.Run())
}

// agentProcess runs the agent binary (this test binary as main) and
// returns its exit code, stdout+stderr and how long it took.
func agentProcess(t *testing.T, args ...string) (int, string, time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "LATCHKEY_AGENT_TEST_MAIN=1")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out), took
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out), took
}

func TestVersionAndHelpExitZero(t *testing.T) {
	if code, out, _ := agentProcess(t, "--version"); code != 0 || !strings.HasPrefix(out, "latchkey-agent ") {
		t.Fatalf("--version: %d %q", code, out)
	}
	if code, out, _ := agentProcess(t, "run", "--help"); code != 0 || !strings.Contains(out, "-verifier") {
		t.Fatalf("--help: %d %q", code, out)
	}
}

// Local mistakes exit 2 at once, before any network: the verifier address
// is a listener that fails the test if anything connects.
func TestLocalMistakesExitBadConfigBeforeAnyNetwork(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	connected := make(chan struct{}, 1)
	go func() {
		if c, err := lis.Accept(); err == nil {
			c.Close()
			connected <- struct{}{}
		}
	}()
	addr := lis.Addr().String()
	pin := "sha256:" + strings.Repeat("ab", 32)
	cfgPath := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(cfgPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--config", cfgPath, "--kernel-cmdline", "/dev/null", "--pin", pin, "--no-join", "--disk-mode", "key-only"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"https verifier", []string{"--verifier", "https://" + addr, "--node-name", "n1", "--disk-uuid", "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"},
			"give host:port without a scheme"},
		{"upper-case node name", []string{"--verifier", addr, "--node-name", "Node1", "--disk-uuid", "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"},
			"Node1\\\" is not a valid Kubernetes node name"},
		{"key-only without uuid", []string{"--verifier", addr, "--node-name", "n1"}, "key-only needs the disk's UUID"},
		{"malformed uuid", []string{"--verifier", addr, "--node-name", "n1", "--disk-uuid", "not-a-uuid"}, "not a canonical lower-case UUID"},
		{"negative timeout", []string{"--verifier", addr, "--node-name", "n1", "--disk-uuid", "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b", "--timeout", "-5s"},
			"timeout -5s is negative"},
		{"bogus log level", []string{"--verifier", addr, "--log-level", "bogus"}, `--log-level "bogus": want debug, info, warn or error`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, took := agentProcess(t, append(append([]string{"run"}, common...), tc.args...)...)
			if code != exitcode.BadConfig || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, output %q; want exit %d and %q", code, out, exitcode.BadConfig, tc.want)
			}
			t.Logf("refused in %v", took)
		})
	}
	select {
	case <-connected:
		t.Fatal("the agent connected to the verifier despite a bad configuration")
	default:
	}
}

// TestMissingTPMIsRestarted: a TPM that is not there yet (a driver
// loading late) is a device failure the unit restarts, not a bad
// configuration it never restarts; a bad PCR list stays a bad
// configuration.
func TestMissingTPMIsRestarted(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(cfgPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"run", "--config", cfgPath, "--kernel-cmdline", "/dev/null", "--pin", "sha256:" + strings.Repeat("ab", 32),
		"--no-join", "--disk-mode", "key-only", "--verifier", "127.0.0.1:1", "--node-name", "n1",
		"--disk-uuid", "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b", "--variant", "tpm", "--status-file", "-"}
	code, out, _ := agentProcess(t, append(common, "--tpm-device", filepath.Join(t.TempDir(), "tpmrm0"))...)
	if code != exitcode.DeviceFailed || !strings.Contains(out, "no such file or directory") || !strings.Contains(out, "exit=device-failed") {
		t.Fatalf("missing TPM: exit %d, output %q; want %d (device-failed)", code, out, exitcode.DeviceFailed)
	}
	// A PCR the TPM does not have is the operator's to fix, even with the
	// TPM missing too.
	badPCRs := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(badPCRs, []byte("tpm:\n  pcrs: [0, 99]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string(nil), common...)
	args[2] = badPCRs
	if code, out, _ := agentProcess(t, append(args, "--tpm-device", filepath.Join(t.TempDir(), "tpmrm0"))...); code != exitcode.BadConfig ||
		!strings.Contains(out, "99") {
		t.Fatalf("PCR 99: exit %d, output %q; want %d", code, out, exitcode.BadConfig)
	}
	// A swtpm address nobody listens on: not answering.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if code, out, _ := agentProcess(t, append(common, "--tpm-device", "tcp://"+addr)...); code != exitcode.DeviceFailed {
		t.Fatalf("TPM not answering: exit %d, output %q; want %d", code, out, exitcode.DeviceFailed)
	}
}
