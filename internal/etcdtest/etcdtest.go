// Package etcdtest starts real etcd members (the etcd binary of Debian's
// etcd-server, or $LATCHKEY_ETCD) on loopback for tests: one member or a
// cluster, with client and peer TLS from a test CA and client
// certificates required, or one plain-HTTP member. Every member's data
// lives in the test's own temporary folder and every process it starts
// is killed when the test ends; a member can be killed (SIGKILL) and
// started again to test what a lost quorum does.
//
// Test only: scripts/test.sh fails the build check when a shipped binary
// links it.
package etcdtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/latchkey/latchkey/internal/pkitest"
)

// Cluster is a running etcd cluster.
type Cluster struct {
	// Members in the order they were named (m0, m1, ...).
	Members []*Member
	// CA signed every certificate; nil for a plain-HTTP member.
	CA *pkitest.Cert
	// CAFile, CertFile and KeyFile are the CA and a client certificate
	// with its key (PEM files), for a client's TLS; empty without TLS.
	CAFile, CertFile, KeyFile string
	dir                       string
}

// Member is one etcd process.
type Member struct {
	Name string
	// ClientURL is the member's client endpoint (https:// or http://).
	ClientURL string
	args      []string
	logPath   string
	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
}

// Binary is the etcd server the tests start: $LATCHKEY_ETCD, else etcd on
// $PATH. A test skips when there is none.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("LATCHKEY_ETCD"); p != "" {
		return p
	}
	p, err := exec.LookPath("etcd")
	if err != nil {
		tb.Skip("no etcd binary (apt-get install etcd-server, or set LATCHKEY_ETCD)")
	}
	return p
}

// StartTLS starts an n-member cluster with client and peer TLS, client
// certificates required, and waits until it serves.
func StartTLS(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := &Cluster{dir: tb.TempDir(), CA: pkitest.NewCA(tb, "latchkey etcd test CA")}
	c.CAFile = filepath.Join(c.dir, "ca.crt")
	if err := os.WriteFile(c.CAFile, c.CA.PEM(), 0o600); err != nil {
		tb.Fatal(err)
	}
	server := pkitest.Issue(tb, &x509.Certificate{Subject: pkix.Name{CommonName: "etcd"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}, c.CA)
	serverCert, serverKey := server.WriteFiles(tb, c.dir, "server.crt", "server.key")
	c.CertFile, c.KeyFile = c.ClientCert(tb, "latchkey-verifier")
	tlsArgs := []string{"--cert-file", serverCert, "--key-file", serverKey, "--client-cert-auth", "--trusted-ca-file", c.CAFile,
		"--peer-cert-file", serverCert, "--peer-key-file", serverKey, "--peer-client-cert-auth", "--peer-trusted-ca-file", c.CAFile}
	c.start(tb, n, "https", tlsArgs)
	return c
}

// StartInsecure starts one plain-HTTP member on loopback.
func StartInsecure(tb testing.TB) *Cluster {
	tb.Helper()
	c := &Cluster{dir: tb.TempDir()}
	c.start(tb, 1, "http", nil)
	return c
}

// ClientCert issues a client certificate of the cluster's CA named cn and
// returns its certificate and key files.
func (c *Cluster) ClientCert(tb testing.TB, cn string) (certFile, keyFile string) {
	tb.Helper()
	cert := pkitest.Issue(tb, &x509.Certificate{Subject: pkix.Name{CommonName: cn},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, c.CA)
	return cert.WriteFiles(tb, c.dir, cn+".crt", cn+".key")
}

func (c *Cluster) start(tb testing.TB, n int, scheme string, extra []string) {
	tb.Helper()
	bin := Binary(tb)
	peers := make([]string, n)
	clients := make([]string, n)
	for i := range n {
		peers[i] = fmt.Sprintf("m%d=%s://%s", i, scheme, freeAddr(tb))
		clients[i] = scheme + "://" + freeAddr(tb)
	}
	for i := range n {
		name, peerURL, _ := strings.Cut(peers[i], "=")
		m := &Member{Name: name, ClientURL: clients[i], logPath: filepath.Join(c.dir, name+".log")}
		m.args = append([]string{bin, "--name", name, "--data-dir", filepath.Join(c.dir, name+".data"),
			"--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", strings.Join(peers, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "latchkey-test", "--logger", "zap", "--log-level", "warn"}, extra...)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.Start(tb)
	}
	tb.Cleanup(func() {
		for _, m := range c.Members {
			m.Kill()
		}
	})
	c.WaitReady(tb, c.Members...)
}

// freeAddr is a loopback address with a port nobody listens on now.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.Members))
	for i, m := range c.Members {
		out[i] = m.ClientURL
	}
	return out
}

// ClientAs is a client of every member authenticating with another
// client certificate (whose CN etcd takes as the user name when
// authentication is enabled), closed when the test ends.
func (c *Cluster) ClientAs(tb testing.TB, certFile, keyFile string) *clientv3.Client {
	tb.Helper()
	tc, err := transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: c.CAFile}.ClientConfig()
	if err != nil {
		tb.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: tc})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Client is an etcd client of the cluster (the test's own, for setup and
// inspection), closed when the test ends.
func (c *Cluster) Client(tb testing.TB, members ...*Member) *clientv3.Client {
	tb.Helper()
	if len(members) == 0 {
		members = c.Members
	}
	eps := make([]string, len(members))
	for i, m := range members {
		eps[i] = m.ClientURL
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if c.CA != nil {
		tc, err := c.tlsConfig()
		if err != nil {
			tb.Fatal(err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// WaitReady waits until each member answers a linearizable read (which
// needs a leader), for at most a minute.
func (c *Cluster) WaitReady(tb testing.TB, members ...*Member) {
	tb.Helper()
	for _, m := range members {
		cli := c.Client(tb, m)
		deadline := time.Now().Add(time.Minute)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := cli.Get(ctx, "latchkey-etcdtest-ready")
			cancel()
			if err == nil {
				break
			}
			if m.exited() || time.Now().After(deadline) {
				tb.Fatalf("etcd member %s not ready: %v\n%s", m.Name, err, m.logTail())
			}
		}
		cli.Close()
	}
}

// Start starts the member's process (again, after Kill: with its data).
func (m *Member) Start(tb testing.TB) {
	tb.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(m.args[0], m.args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("start etcd member %s: %v", m.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	m.cmd, m.done = cmd, done
}

// Kill ends the member's process with SIGKILL and waits for it; a member
// not running is left alone.
func (m *Member) Kill() {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// PID is the member's process ID (0 when it is not running).
func (m *Member) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

func (m *Member) exited() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done == nil {
		return true
	}
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// logTail is the end of the member's log, for a failure message.
func (m *Member) logTail() string {
	data, err := os.ReadFile(m.logPath)
	if err != nil {
		return err.Error()
	}
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(bytes.TrimSpace(data))
}

// tlsConfig is the client TLS of the cluster's own client certificate.
func (c *Cluster) tlsConfig() (*tls.Config, error) {
	if c.CA == nil {
		return nil, errors.New("etcdtest: the cluster has no TLS")
	}
	return transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile}.ClientConfig()
}
