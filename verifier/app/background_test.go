package app

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// Serve returns only after every goroutine it started has returned: the
// policy reloader, the metrics server, the admin API, the CSR approver,
// the token reaper, the token revoker and the join server.
func TestServeWaitsForItsGoroutines(t *testing.T) {
	dir := t.TempDir()
	pcr := strings.Repeat("ab", 32)
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"),
		[]byte("apiVersion: latchkey/v1\ntpm:\n  ekPublicKeyHashes: [sha256:"+pcr+"]\n  pcrs: {7: ["+pcr+"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	if err := os.WriteFile(filepath.Join(dir, "master"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &Config{Policy: filepath.Join(dir, "policy.yaml"), MasterSecretFile: filepath.Join(dir, "master"),
		ClusterSalt: "test-cluster", StateDir: filepath.Join(dir, "state"),
		AdminSocket: filepath.Join(dir, "admin.sock"), MetricsListen: "127.0.0.1:0", Kubernetes: &Kubernetes{}}
	ready := make(chan struct{})
	v, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Listener: lis,
		Minter: &recordingMinter{}, Ready: func() { close(ready) }})
	if err != nil {
		t.Fatal(err)
	}
	v.kube = fake.NewClientset() // the approver and the reaper run too
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Serve(ctx) }()
	<-ready
	// policy store, metrics, the disks-by-generation count, approver,
	// reaper, the shutdown of the informer factory they share, join
	// server, admin API, and the revoker of denied nodes' tokens when
	// there is a minter (the re-attestation controller needs the Lease
	// store, which this verifier, bound to a directory, does not have).
	want := 8
	if v.revoker != nil {
		want++
	}
	if n := v.bg.Running(); n != want {
		t.Fatalf("%d background goroutines running, want %d", n, want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	if n := v.bg.Running(); n != 0 {
		t.Fatalf("Serve returned with %d background goroutines still running", n)
	}
}

// Running is how many goroutines are still running.
func (b *background) Running() int { return int(b.running.Load()) }
