package tlswatch

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/benchtest"
	"github.com/latchkey/latchkey/internal/pkitest"
)

// benchServer serves TLS 1.3 on l as gRPC does (the handshake, then the
// server's first write) until l closes.
func benchServer(l net.Listener, cfg *tls.Config) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			tc := tls.Server(c, cfg)
			if tc.Handshake() == nil {
				_, _ = tc.Write([]byte("settings"))
				_, _ = io.Copy(io.Discard, tc)
			}
		}()
	}
}

// BenchmarkHandshakeWatchedVsPlain runs loopback TLS 1.3 handshakes in
// alternating blocks against a plain listener and a watched one in the
// same process, and reports the process CPU time per handshake of each
// (client and server together) and their ratio: what the watcher costs,
// measured in one run so machine load weighs on both alike.
func BenchmarkHandshakeWatchedVsPlain(b *testing.B) {
	cert := pkitest.SelfSigned(b, "verifier")
	cfg := atls.ServerConfig(cert.TLSCertificate())
	addrs := [2]string{}
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
		if i == 1 {
			go benchServer(Wrap(l, Config{}), cfg)
		} else {
			go benchServer(l, cfg)
		}
	}
	client, err := atls.ClientConfig([]atls.Pin{atls.PinOf(cert.Cert)}, false)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, len("settings"))
	handshake := func(addr string) {
		c, err := tls.Dial("tcp", addr, client)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	const block = 25
	var cpu [2]time.Duration
	var n [2]int
	b.ResetTimer()
	for done := 0; done < b.N; {
		for i, addr := range addrs {
			k := min(block, b.N-done)
			if k == 0 {
				break
			}
			start := benchtest.SelfCPU(b)
			for range k {
				handshake(addr)
			}
			cpu[i] += benchtest.SelfCPU(b) - start
			n[i] += k
			done += k
		}
	}
	if n[0] == 0 || n[1] == 0 {
		return
	}
	plain := float64(cpu[0].Microseconds()) / float64(n[0])
	watched := float64(cpu[1].Microseconds()) / float64(n[1])
	b.ReportMetric(plain, "plain-cpu-us/handshake")
	b.ReportMetric(watched, "watched-cpu-us/handshake")
	b.ReportMetric(watched/plain, "watched/plain")
}
