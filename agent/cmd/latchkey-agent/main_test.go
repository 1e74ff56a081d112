package main

import (
	"bytes"
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

	"sigs.k8s.io/yaml"

	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	tpmwire "github.com/latchkey/latchkey/attest/tpm/wire"
	"github.com/latchkey/latchkey/internal/sdnotify/sdnotifytest"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/servingcert"
)

// notification is one sd_notify datagram and when it arrived.
type notification struct {
	at  time.Time
	msg string
}

func collect(c *net.UnixConn, out chan<- notification) {
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if err != nil {
			close(out)
			return
		}
		out <- notification{time.Now(), string(buf[:n])}
	}
}

// endMarker ends the notifications of one boot.
const endMarker = "X_LATCHKEY_TEST=end"

// sendMarker queues endMarker on the notify socket at path.
func sendMarker(t testing.TB, path string) {
	t.Helper()
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(endMarker)); err != nil {
		t.Fatal(err)
	}
}

// startVerifier runs the assembled verifier in this process with a policy
// measured from sim, and returns its address and pin.
func startVerifier(t testing.TB, sim *tpmtest.Simulator) (string, string) {
	t.Helper()
	dir := t.TempDir()
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, []int{0, 7})
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := yaml.Marshal(map[string]any{"apiVersion": "latchkey/v1", "tpm": tpmwire.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}})
	os.WriteFile(filepath.Join(dir, "policy.yaml"), pol, 0o600)
	secret := make([]byte, 32)
	rand.Read(secret)
	os.WriteFile(filepath.Join(dir, "master"), secret, 0o600)
	cfg := &app.Config{Policy: filepath.Join(dir, "policy.yaml"), MasterSecretFile: filepath.Join(dir, "master"),
		ClusterSalt: "t", StateDir: filepath.Join(dir, "state"), AdminSocket: "-"}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	v, err := app.New(cfg, app.Deps{Listener: lis, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	cert, _ := app.ServingCertificate(cfg)
	pins, _ := servingcert.Pins(cert)
	return lis.Addr().String(), pins[0].String()
}

// boot runs `latchkey-agent run` in this process (key-only disk, no join)
// and returns its exit code and every notification it sent.
func bootOnce(t testing.TB, sim *tpmtest.Simulator, addr, pin string) (int, []notification, time.Time) {
	t.Helper()
	conn, path := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", path)
	ch := make(chan notification, 64)
	go collect(conn, ch)
	var stderr bytes.Buffer
	start := time.Now()
	code := run([]string{"run", "--config", "/dev/null", "--kernel-cmdline", "/dev/null", "--verifier", addr, "--pin", pin,
		"--tpm-device", sim.Device, "--node-name", "n1", "--disk-mode", "key-only",
		"--disk-uuid", "6c0e2f5a-4b1d-4e8f-9a3c-2d7b5e1f0a94", "--no-join", "--no-reattest", "--timeout", "20s", "--log-level", "error",
		"--status-file", filepath.Join(t.TempDir(), "last.json")}, io.Discard, &stderr)
	// Sending a notification is synchronous: every one run sent is queued
	// on the socket by now, so a marker sent after them is read after them.
	sendMarker(t, path)
	var got []notification
	for n := range ch {
		if n.msg == endMarker {
			break
		}
		got = append(got, n)
	}
	conn.Close()
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	return code, got, start
}

func TestBootNotifiesStatusAndReadyInOrder(t *testing.T) {
	sim := tpmtest.Start(t)
	addr, pin := startVerifier(t, sim)
	_, got, _ := bootOnce(t, sim, addr, pin)
	var msgs []string
	for _, n := range got {
		msgs = append(msgs, n.msg)
	}
	all := strings.Join(msgs, "\n")
	order := []string{"STATUS=inspecting state disk", "STATUS=attesting to " + addr + " (attempt 1)",
		"STATUS=unlocking state disk", "READY=1\nSTATUS=state disk open", "READY=1\nSTATUS=node ready"}
	pos := 0
	for _, want := range order {
		i := strings.Index(all[pos:], want)
		if i < 0 {
			t.Fatalf("notification %q missing or out of order in:\n%s", want, all)
		}
		pos += i + len(want)
	}
}

// BenchmarkStartToReadyOverhead is the agent's own time from start to
// READY, excluding the ticket stage (network round trips and the TPM):
// (first attempt - start) + (READY - ticket received).
func BenchmarkStartToReadyOverhead(b *testing.B) {
	sim := tpmtest.Start(b)
	addr, pin := startVerifier(b, sim)
	var total time.Duration
	for i := 0; i < b.N; i++ {
		_, got, start := bootOnce(b, sim, addr, pin)
		var attempt, unlocking, ready time.Time
		for _, n := range got {
			switch {
			case strings.HasPrefix(n.msg, "STATUS=attesting to") && attempt.IsZero():
				attempt = n.at
			case n.msg == "STATUS=unlocking state disk":
				unlocking = n.at
			case strings.HasPrefix(n.msg, "READY=1") && ready.IsZero():
				ready = n.at
			}
		}
		total += attempt.Sub(start) + ready.Sub(unlocking)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "overhead-ms/op")
}
