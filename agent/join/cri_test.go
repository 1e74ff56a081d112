package join

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/execx/execxtest"
)

// TestJoinWaitsForTheRuntime: kubeadm runs only once the CRI socket
// listens (the runtime comes up after the agent's READY).
func TestJoinWaitsForTheRuntime(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	f := &execxtest.Fake{Rules: []execxtest.Rule{{Match: "kubeadm join"}}}
	j := newJoiner(t, f, func(c *Config) { c.CRISocket = "unix://" + sock; c.CRIWait = 20 * time.Second })
	listening := make(chan time.Time, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { l.Close() })
		listening <- time.Now()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := j.Join(context.Background(), workerTicket()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-listening:
	default:
		t.Fatal("kubeadm ran before the runtime listened")
	}
	if f.Ran("kubeadm join") != 1 {
		t.Fatalf("calls %v", f.Calls())
	}
}

// TestJoinRuntimeNeverUp: no kubeadm (and no reset) when the runtime does
// not come up in time; the error names the socket and the wait.
func TestJoinRuntimeNeverUp(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	f := &execxtest.Fake{}
	j := newJoiner(t, f, func(c *Config) { c.CRISocket = "unix://" + sock; c.CRIWait = 600 * time.Millisecond })
	err := j.Join(context.Background(), workerTicket())
	want := "join: container runtime unix://" + sock + " not listening after 600ms"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if n := len(f.Calls()); n != 0 {
		t.Fatalf("kubeadm ran %d times", n)
	}
}

// TestDryRunDoesNotWaitForTheRuntime: a dry run starts nothing, so it
// needs no runtime.
func TestDryRunDoesNotWaitForTheRuntime(t *testing.T) {
	f := &execxtest.Fake{Rules: []execxtest.Rule{{Match: "kubeadm join"}}}
	j := newJoiner(t, f, func(c *Config) {
		c.DryRun, c.CRISocket, c.CRIWait = true, "unix://"+filepath.Join(t.TempDir(), "none.sock"), time.Hour
	})
	if err := j.Join(context.Background(), workerTicket()); err != nil {
		t.Fatal(err)
	}
}

// listenUnix is a CRI socket that accepts connections, for tests whose
// join names one.
func listenUnix(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return sock
}
