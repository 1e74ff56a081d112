package join

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/execx/execxtest"
)

// logSignal is a log sink that closes seen at the first line holding msg:
// a test waits on what the code under test says it is doing.
type logSignal struct {
	msg  string
	once sync.Once
	seen chan struct{}
}

func (w *logSignal) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.msg)) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestJoinWaitsForTheRuntime: kubeadm runs only once the CRI socket
// listens (the runtime comes up after the agent's READY). The socket
// comes up once the join says it is waiting, so the wait is exercised.
func TestJoinWaitsForTheRuntime(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	f := &execxtest.Fake{Rules: []execxtest.Rule{{Match: "kubeadm join"}}}
	waiting := &logSignal{msg: "waiting for the container runtime", seen: make(chan struct{})}
	j := newJoiner(t, f, func(c *Config) {
		c.CRISocket, c.CRIWait = "unix://"+sock, 20*time.Second
		c.Logger = slog.New(slog.NewTextHandler(waiting, nil))
	})
	listening := make(chan time.Time, 1)
	go func() {
		select {
		case <-waiting.seen:
		case <-time.After(20 * time.Second):
			t.Error("the join never said it waits for the runtime")
			return
		}
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
