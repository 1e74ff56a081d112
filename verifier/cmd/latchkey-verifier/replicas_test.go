package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/internal/yamltest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// replicaCA is the operator's CA that signs every replica's serving
// certificate; agents pin the CA, so each replica keeps its own key.
type replicaCA struct {
	ca   *pkitest.Cert
	cert *x509.Certificate
}

func newReplicaCA(t testing.TB) *replicaCA {
	t.Helper()
	ca := pkitest.NewCA(t, "latchkey verifiers CA")
	return &replicaCA{ca: ca, cert: ca.Cert}
}

// issue writes a serving certificate (chain: leaf, CA) and key for one
// replica into dir.
func (ca *replicaCA) issue(t testing.TB, dir string, n int) (certFile, keyFile string) {
	t.Helper()
	leaf := pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: fmt.Sprintf("verifier-%d", n)},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"verifier.latchkey.test"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca.ca)
	return leaf.WriteFiles(t, dir, "tls.crt", "tls.key", ca.ca)
}

// replica is one verifier process.
type replica struct {
	cmd   *exec.Cmd
	addr  string
	keyID string
}

var (
	servingRE = regexp.MustCompile(`msg="verifier serving" address=(\S+)`)
	keyIDRE   = regexp.MustCompile(`msg="master secret loaded" key_id=(\S+)`)
)

// startReplica runs `latchkey-verifier serve --config cfg` as its own
// process and waits for its serving line.
func startReplica(t *testing.T, cfg string) *replica {
	t.Helper()
	cmd := exec.Command(os.Args[0], "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), "LATCHKEY_VERIFIER_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{cmd: cmd}
	t.Cleanup(func() { r.stop() })
	lines := bufio.NewScanner(stderr)
	deadline := time.AfterFunc(30*time.Second, func() { r.stop() })
	defer deadline.Stop()
	for lines.Scan() {
		if m := keyIDRE.FindStringSubmatch(lines.Text()); m != nil {
			r.keyID = m[1]
		}
		if m := servingRE.FindStringSubmatch(lines.Text()); m != nil {
			r.addr = m[1]
			go io.Copy(io.Discard, stderr)
			return r
		}
	}
	t.Fatalf("replica %s never served", cfg)
	return nil
}

// stop kills the process this test started (and only it).
func (r *replica) stop() {
	if r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// Three verifier processes behind one identity: a CA signs each
// replica's own serving certificate and agents pin the CA. Every replica
// hands the same disk the same key, and an agent fails over when one
// replica dies.
func TestThreeReplicasOnePin(t *testing.T) {
	rig := newTPMRig(t)
	dir := rig.dir
	secret := filepath.Join(dir, "master")
	if code, _, errs := runCLI(t, "secret", "init", secret); code != 0 {
		t.Fatal(errs)
	}
	ca := newReplicaCA(t)
	var replicas []*replica
	for n := range 3 {
		rdir := filepath.Join(dir, fmt.Sprintf("r%d", n))
		os.Mkdir(rdir, 0o700)
		certFile, keyFile := ca.issue(t, rdir, n)
		replicas = append(replicas, startReplica(t, yamltest.Write(t, filepath.Join(rdir, "verifier.yaml"), map[string]any{
			"listen": "127.0.0.1:0", "policy": rig.policy, "masterSecretFile": secret, "clusterSalt": "replicas",
			"stateDir": rdir, "tlsCert": certFile, "tlsKey": keyFile, "adminSocket": "-"})))
	}
	for _, r := range replicas[1:] {
		if r.keyID == "" || r.keyID != replicas[0].keyID {
			t.Fatalf("replicas show key ids %q and %q", replicas[0].keyID, r.keyID)
		}
	}
	pin := atls.PinOf(ca.cert)
	iss := rig.iss
	get := func(endpoints []string, start int) []byte {
		t.Helper()
		c, err := ticket.New(ticket.Config{Endpoints: endpoints, Pins: []atls.Pin{pin}, Issuer: iss,
			Timeout: 20 * time.Second, AttemptTimeout: 5 * time.Second, InitialBackoff: 10 * time.Millisecond,
			MaxBackoff: 20 * time.Millisecond, Start: func(int) int { return start },
			Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		tk, err := c.Get(context.Background(), ticket.Request{NodeName: "node-1",
			DiskUUID: "6c1f0d9e-2b3a-4c5d-8e7f-9a0b1c2d3e4f", Role: latchkeyv1.Role_ROLE_WORKER})
		if err != nil {
			t.Fatalf("join via %v: %v", endpoints, err)
		}
		return tk.DiskKey
	}
	first := get([]string{replicas[0].addr}, 0)
	for _, r := range replicas[1:] {
		if k := get([]string{r.addr}, 0); !bytes.Equal(k, first) {
			t.Fatalf("replica %s gives another key for the same disk", r.addr)
		}
	}
	replicas[0].stop()
	all := []string{replicas[0].addr, replicas[1].addr, replicas[2].addr}
	if k := get(all, 0); !bytes.Equal(k, first) {
		t.Fatal("after failover: another key")
	}
	if len(first) != 32 {
		t.Fatalf("key is %d bytes", len(first))
	}
	// The CA signs the replicas for 127.0.0.1 and verifier.latchkey.test:
	// an agent that expects another name refuses them, pin or not.
	c, err := ticket.New(ticket.Config{Endpoints: []string{replicas[1].addr}, Pins: []atls.Pin{pin}, Issuer: iss,
		ServerName: "elsewhere.example", Timeout: 5 * time.Second,
		Sleep:  func(context.Context, time.Duration) error { return context.Canceled },
		Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Get(context.Background(), ticket.Request{NodeName: "node-1",
		DiskUUID: "6c1f0d9e-2b3a-4c5d-8e7f-9a0b1c2d3e4f", Role: latchkeyv1.Role_ROLE_WORKER})
	if !errors.Is(err, atls.ErrPinMismatch) || !strings.Contains(err.Error(), `not valid for "elsewhere.example"`) {
		t.Fatalf("err = %v, want a name refusal", err)
	}
}
