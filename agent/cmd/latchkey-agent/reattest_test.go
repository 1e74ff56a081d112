package main

import (
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/sdnotify/sdnotifytest"
)

// TestAgentKeepsReattesting: after READY the agent stays running and
// re-attests (real swtpm, real verifier) until SIGTERM, which ends it
// with 0.
func TestAgentKeepsReattesting(t *testing.T) {
	sim := tpmtest.Start(t)
	addr, pin := startVerifier(t, sim)
	conn, path := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", path)
	ch := make(chan notification, 64)
	go collect(conn, ch)
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"run", "--config", "/dev/null", "--kernel-cmdline", "/dev/null", "--verifier", addr, "--pin", pin,
			"--tpm-device", sim.Device, "--node-name", "n1", "--disk-mode", "key-only",
			"--disk-uuid", "6c0e2f5a-4b1d-4e8f-9a3c-2d7b5e1f0a94", "--no-join", "--reattest-interval", "1s",
			"--timeout", "20s", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	deadline := time.After(60 * time.Second)
	var seen []string
	for {
		select {
		case n := <-ch:
			seen = append(seen, n.msg)
			if n.msg != "STATUS=node ready; re-attestation 2: attested" {
				continue
			}
		case code := <-done:
			t.Fatalf("agent exited %d before re-attesting twice; notifications:\n%s", code, strings.Join(seen, "\n"))
		case <-deadline:
			t.Fatalf("no second re-attestation in 60s; notifications:\n%s", strings.Join(seen, "\n"))
		}
		break
	}
	if !strings.Contains(strings.Join(seen, "\n"), "STATUS=node ready; re-attestation 1: attested") {
		t.Fatalf("first re-attestation missing:\n%s", strings.Join(seen, "\n"))
	}
	// The agent's signal.NotifyContext is listening, so this ends run, not
	// the test binary.
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after SIGTERM, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop on SIGTERM")
	}
}
