package tlswatch

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/logtest"
	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/verifier/metrics"
)

// server stands in for gRPC's transport: a TLS 1.3 handshake under a
// deadline, and after it the server's first write (gRPC's settings
// frame), then reading until the client leaves.
type server struct {
	addr   string
	cert   *pkitest.Cert
	closed chan struct{} // one value per connection the server closed
	log    *logtest.Buffer
	now    time.Time

	mu     sync.Mutex
	causes []string
}

func newServer(t *testing.T, handshakeTimeout time.Duration) *server {
	t.Helper()
	s := &server{cert: pkitest.SelfSigned(t, "verifier"), closed: make(chan struct{}, 16), log: &logtest.Buffer{},
		now: time.Unix(1_800_000_000, 0)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	s.addr = l.Addr().String()
	wl := Wrap(l, Config{Logger: slog.New(slog.NewTextHandler(s.log, nil)),
		Now: func() time.Time { s.mu.Lock(); defer s.mu.Unlock(); return s.now },
		OnFailure: func(cause string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.causes = append(s.causes, cause)
		}})
	cfg := atls.ServerConfig(s.cert.TLSCertificate())
	go func() {
		for {
			c, err := wl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { s.closed <- struct{}{} }()
				defer c.Close()
				c.SetDeadline(time.Now().Add(handshakeTimeout))
				tc := tls.Server(c, cfg)
				if tc.Handshake() != nil {
					return
				}
				c.SetDeadline(time.Time{})
				if _, err := tc.Write([]byte("settings")); err != nil {
					return
				}
				io.Copy(io.Discard, tc)
			}()
		}
	}()
	return s
}

// after runs client, waits until the server closed the connection and
// returns the causes counted for it.
func (s *server) after(t *testing.T, client func(net.Conn)) []string {
	t.Helper()
	s.mu.Lock()
	before := len(s.causes)
	s.mu.Unlock()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	client(c)
	c.Close()
	select {
	case <-s.closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the server never closed the connection")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.causes[before:]...)
}

func tlsClient(t *testing.T, c net.Conn, cfg *tls.Config) error {
	t.Helper()
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return err
	}
	buf := make([]byte, len("settings"))
	_, err := io.ReadFull(tc, buf)
	return err
}

func pinned(t *testing.T, pin *pkitest.Cert) *tls.Config {
	t.Helper()
	cfg, err := atls.ClientConfig([]atls.Pin{atls.PinOf(pin.Cert)}, false)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestCausesOfFailedHandshakes(t *testing.T) {
	s := newServer(t, 30*time.Second)
	other := pkitest.SelfSigned(t, "rotated-away")
	for _, c := range []struct {
		name   string
		client func(t *testing.T, c net.Conn)
		want   []string
	}{
		{"pinned agent", func(t *testing.T, c net.Conn) {
			if err := tlsClient(t, c, pinned(t, s.cert)); err != nil {
				t.Errorf("the pinned client failed: %v", err)
			}
		}, nil},
		// The agent's own configuration, pinned to a certificate the
		// verifier no longer serves.
		{"agent with a stale pin", func(t *testing.T, c net.Conn) {
			if err := tlsClient(t, c, pinned(t, other)); !errors.Is(err, atls.ErrPinMismatch) {
				t.Errorf("stale pin: %v", err)
			}
		}, []string{metrics.HandshakeClientAlert}},
		{"client hangs up on the certificate", func(t *testing.T, c net.Conn) {
			cfg := pinned(t, other)
			cfg.VerifyConnection = func(tls.ConnectionState) error { c.Close(); return errors.New("hang up") }
			if err := tlsClient(t, c, cfg); err == nil {
				t.Error("handshake succeeded")
			}
		}, []string{metrics.HandshakeClientClosed}},
		{"TLS 1.2 only", func(t *testing.T, c net.Conn) {
			cfg := pinned(t, s.cert)
			cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			if err := tlsClient(t, c, cfg); err == nil || !strings.Contains(err.Error(), "protocol version") {
				t.Errorf("TLS 1.2 client: %v", err)
			}
		}, []string{metrics.HandshakeServerRefused}},
		{"wrong ALPN", func(t *testing.T, c net.Conn) {
			cfg := pinned(t, s.cert)
			cfg.NextProtos = []string{"spdy/3"}
			if err := tlsClient(t, c, cfg); err == nil {
				t.Error("handshake succeeded")
			}
		}, []string{metrics.HandshakeServerRefused}},
		{"plain HTTP", func(t *testing.T, c net.Conn) {
			c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: verifier\r\n\r\n"))
			io.Copy(io.Discard, c)
		}, []string{metrics.HandshakeNotTLS}},
		{"TCP health check", func(t *testing.T, c net.Conn) {}, []string{metrics.HandshakeIncomplete}},
		{"half a record header", func(t *testing.T, c net.Conn) { c.Write([]byte{recordHandshake, 3, 1}) },
			[]string{metrics.HandshakeIncomplete}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := s.after(t, func(conn net.Conn) { c.client(t, conn) })
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Errorf("causes %v, want %v", got, c.want)
			}
		})
	}
}

// TestSilentClientTimesOut: a client that connects and says nothing is
// closed at the handshake deadline (gRPC's connection timeout).
func TestSilentClientTimesOut(t *testing.T) {
	s := newServer(t, 50*time.Millisecond)
	got := s.after(t, func(c net.Conn) { io.Copy(io.Discard, c) }) // until the server closes
	if len(got) != 1 || got[0] != metrics.HandshakeTimeout {
		t.Fatalf("causes %v, want timeout", got)
	}
	// A client that sent its hello and then stalls times out too.
	got = s.after(t, func(c net.Conn) {
		c.Write([]byte{recordHandshake, 3, 1, 0, 200, 1, 0})
		io.Copy(io.Discard, c)
	})
	if len(got) != 1 || got[0] != metrics.HandshakeTimeout {
		t.Fatalf("stalled hello: causes %v, want timeout", got)
	}
}

// TestLogRateIsBounded: one line per cause per minute, the next one
// naming how many were not logged.
func TestLogRateIsBounded(t *testing.T) {
	s := newServer(t, 30*time.Second)
	other := pkitest.SelfSigned(t, "rotated-away")
	stale := func(c net.Conn) { _ = tlsClient(t, c, pinned(t, other)) }
	for range 3 {
		s.after(t, stale)
	}
	s.after(t, func(net.Conn) {}) // another cause has its own budget
	lines := func() []string { return strings.Split(strings.TrimSpace(s.log.String()), "\n") }
	if got := lines(); len(got) != 2 || !strings.Contains(got[0], "cause=client_alert") ||
		!strings.Contains(got[0], "suppressed=0") || !strings.Contains(got[0], "peer=127.0.0.1:") ||
		!strings.Contains(got[0], "pin matches no certificate") || !strings.Contains(got[1], "cause=incomplete_hello") {
		t.Fatalf("log after three stale pins and a health check:\n%s", s.log.String())
	}
	s.mu.Lock()
	s.now = s.now.Add(time.Minute)
	s.mu.Unlock()
	s.after(t, stale)
	if got := lines(); len(got) != 3 || !strings.Contains(got[2], "cause=client_alert") || !strings.Contains(got[2], "suppressed=2") {
		t.Fatalf("log a minute later:\n%s", s.log.String())
	}
}

func TestRecordsFollowsBoundariesAcrossReads(t *testing.T) {
	stream := []byte{22, 3, 1, 0, 2, 'a', 'b', 20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 0}
	for split := 1; split <= len(stream); split++ {
		var r records
		var got []byte
		for p := stream; len(p) > 0; {
			k := min(split, len(p))
			r.feed(p[:k], func(typ byte) { got = append(got, typ) })
			p = p[k:]
		}
		if string(got) != string([]byte{22, 20, 23}) {
			t.Errorf("chunks of %d: records %v", split, got)
		}
	}
}
