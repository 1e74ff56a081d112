package service_test

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/verifier/servingcert"
)

// resumes dials addr twice with one session cache and reports whether the
// second connection resumed the first's session. Each connection reads
// until the server's first post-handshake bytes (gRPC's SETTINGS, or the
// test server's greeting) so a ticket sent with the handshake is taken in.
func resumes(t *testing.T, addr string) bool {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}, InsecureSkipVerify: true,
		ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	var resumed bool
	for i := range 2 {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// The client speaks first in HTTP/2; the preface makes gRPC
			// answer, and reading the answer processes any ticket.
			if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 64)); err != nil {
				t.Fatal(err)
			}
		}
		resumed = c.ConnectionState().DidResume
		c.Close()
	}
	return resumed
}

// TestVerifierNeverResumes: a client that offers resumption gets a full
// handshake every time from the join port, while the same client resumes
// against attested TLS's plain server configuration (the check would
// catch tickets coming back).
func TestVerifierNeverResumes(t *testing.T) {
	e := startVerifier(t, envOpt{})
	if resumes(t, e.addr) {
		t.Fatal("the verifier resumed a TLS session")
	}

	// Control: the same client against the configuration without the
	// verifier's setting does resume.
	cert, err := servingcert.LoadOrCreate(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", atls.ServerConfig(cert))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				if _, err := c.Read(buf); err == nil {
					c.Write([]byte("hello"))
				}
			}()
		}
	}()
	if !resumes(t, lis.Addr().String()) {
		t.Fatal("control: the client did not resume against a server with tickets; the check above proves nothing")
	}
}
