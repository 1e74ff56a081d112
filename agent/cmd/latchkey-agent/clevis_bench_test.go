package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// tangd is Debian's Tang server: one process per connection on its
// standard input and output, as systemd's tangd.socket starts it.
const (
	tangd       = "/usr/libexec/tangd"
	tangdKeygen = "/usr/libexec/tangd-keygen"
)

// startTang serves Tang on loopback the way tangd.socket does (a tangd
// process per accepted connection) and returns its URL.
func startTang(b *testing.B) string {
	b.Helper()
	for _, tool := range []string{tangd, tangdKeygen} {
		if _, err := os.Stat(tool); err != nil {
			b.Skipf("no %s (apt-get install tang): %v", tool, err)
		}
	}
	if _, err := exec.LookPath("clevis"); err != nil {
		b.Skipf("no clevis (apt-get install clevis): %v", err)
	}
	keys := b.TempDir()
	if out, err := exec.Command(tangdKeygen, keys).CombinedOutput(); err != nil {
		b.Fatalf("tangd-keygen: %v\n%s", err, out)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go serveTang(c.(*net.TCPConn), keys)
		}
	}()
	return "http://" + lis.Addr().String()
}

// serveTang runs one tangd on c, as inetd-style socket activation does.
func serveTang(c *net.TCPConn, keys string) {
	defer c.Close()
	f, err := c.File()
	if err != nil {
		return
	}
	defer f.Close()
	cmd := exec.Command(tangd, keys)
	cmd.Stdin, cmd.Stdout = f, f
	_ = cmd.Run()
}

// clevisDecrypt runs `clevis decrypt` of jwe and checks the secret; its
// CPU is the whole process tree's (shell, jose, curl).
func clevisDecrypt(b *testing.B, jwe, secret []byte) (wall, cpu time.Duration) {
	b.Helper()
	cmd := exec.Command("clevis", "decrypt")
	cmd.Stdin = bytes.NewReader(jwe)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	wall = time.Since(start)
	if err != nil {
		b.Fatalf("clevis decrypt: %v\n%s", err, stderr.String())
	}
	if !bytes.Equal(out, secret) {
		b.Fatal("clevis decrypt returned another secret")
	}
	return wall, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// BenchmarkKeyRecoveryVsClevis compares the agent's whole key recovery,
// the shipped build started as a process for a key-only boot (exec,
// TPM evidence with the EK certificate, the verifier's validation,
// credential activation, exit) against the in-process verifier and
// swtpm, with `clevis decrypt` of a secret bound to a Tang server on
// loopback, alternately in one run. Both are a network-bound key released
// to a machine that proves something; neither opens a disk here. Metrics
// are medians; CPU is each process tree's user + system time (the
// verifier's, Tang's and swtpm's are in neither). With
// LATCHKEY_AGENT_COMPARE set to another agent binary, that binary
// recovers the key too in each round (metrics prefixed compare-).
func BenchmarkKeyRecoveryVsClevis(b *testing.B) {
	bin := buildAgent(b)
	url := startTang(b)
	secret := []byte("latchkey benchmark secret\n")
	enc := exec.Command("clevis", "encrypt", "tang", `{"url":"`+url+`"}`, "-y")
	enc.Stdin = bytes.NewReader(secret)
	jwe, err := enc.Output()
	if err != nil {
		b.Fatalf("clevis encrypt tang: %v", err)
	}
	sim := tpmtest.Start(b)
	addr, pin := startVerifier(b, sim)
	relay := startTPMRelay(b, strings.TrimPrefix(sim.Device, "tcp://"))
	args := keyOnlyBoot(b, b.TempDir(), addr, pin, "tcp://"+relay.addr)
	compare := os.Getenv("LATCHKEY_AGENT_COMPARE")
	var this, other recoveries
	var cWall, cCPU []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		this.add(b, bin, args, relay)
		w, c := clevisDecrypt(b, jwe, secret)
		cWall, cCPU = append(cWall, w), append(cCPU, c)
		if compare != "" {
			other.add(b, compare, args, relay)
		}
	}
	b.StopTimer()
	b.ReportMetric(ms(median(cWall)), "clevis-wall-ms/op")
	b.ReportMetric(ms(median(cCPU)), "clevis-cpu-ms/op")
	this.report(b, "", median(cWall), median(cCPU))
	if compare != "" {
		other.report(b, "compare-", median(cWall), median(cCPU))
	}
}

// recoveries keeps one agent binary's key recoveries.
type recoveries struct {
	wall, cpu, tpm []time.Duration
	sched          schedTotals
}

// add runs one key-only boot of bin.
func (r *recoveries) add(b *testing.B, bin string, args []string, relay *tpmRelay) {
	p := bootThroughRelay(b, &r.sched, relay, bin, args)
	r.wall, r.cpu, r.tpm = append(r.wall, p.wall), append(r.cpu, p.cpu), append(r.tpm, relay.since(b, p.start))
}

// report reports r's medians and their ratios to Clevis' medians.
func (r *recoveries) report(b *testing.B, prefix string, clevisWall, clevisCPU time.Duration) {
	b.ReportMetric(ms(median(r.wall)), prefix+"agent-wall-ms/op")
	b.ReportMetric(ms(median(r.cpu)), prefix+"agent-cpu-ms/op")
	b.ReportMetric(ms(median(r.tpm)), prefix+"agent-exec-to-tpm-ms/op")
	r.sched.report(b, prefix+"agent-")
	b.ReportMetric(float64(median(r.wall))/float64(clevisWall), prefix+"wall-ratio")
	b.ReportMetric(float64(median(r.cpu))/float64(clevisCPU), prefix+"cpu-ratio")
}
