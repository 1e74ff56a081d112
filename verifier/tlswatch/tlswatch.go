// Package tlswatch counts the TLS handshakes on the join port that never
// finish, by where they stopped, and logs them at a bounded rate.
//
// gRPC runs the handshake inside its transport and reports a failure to
// no one, so the verifier watches from below: each accepted connection is
// wrapped and the TLS record headers (5 plaintext bytes each) of both
// directions are read as they pass, never the contents, until the
// handshake is seen to finish. TLS 1.3 encrypts the client's alert, so
// why a client gave up cannot be read; where it gave up can. An agent
// whose pin matches no certificate the verifier serves (a certificate
// rotation gone wrong) answers the verifier's certificate with an alert
// and hangs up: client_alert, which before this left no trace at all.
//
// The handshake counts as finished when the server writes an encrypted
// record after the client sent one: the client's first encrypted record
// is its Finished (or an alert), and after a Finished gRPC always writes
// its settings frame, while after an alert the server writes nothing.
package tlswatch

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/metrics"
)

// TLS record content types (RFC 8446, section 5.1).
const (
	recordChangeCipherSpec = 20
	recordAlert            = 21
	recordHandshake        = 22
	recordApplicationData  = 23
)

// Config says whom a failure is told to.
type Config struct {
	// OnFailure is told the cause (a metrics.Handshake* constant) of each
	// failed handshake; optional.
	OnFailure func(cause string)
	// Logger receives at most one line per cause per LogEvery.
	Logger *slog.Logger
	// LogEvery bounds the log rate per cause (default 1m), so a port
	// scan costs no log volume.
	LogEvery time.Duration
	// Now is the clock of the rate limit (tests); default time.Now.
	Now func() time.Time
}

// Wrap watches the handshakes of the connections l accepts. Wrap it
// outside any listener that closes connections at accept on purpose
// (connection limits), or those closings count as failures.
func Wrap(l net.Listener, cfg Config) net.Listener {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LogEvery <= 0 {
		cfg.LogEvery = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &listener{Listener: l, r: &reporter{cfg: cfg, last: map[string]*logState{}}}
}

type listener struct {
	net.Listener
	r *reporter
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, r: l.r}, nil
}

// conn follows one connection's handshake. Until done, every Read and
// Write passes its bytes through the record parsers under mu; after, the
// cost is one atomic load.
type conn struct {
	net.Conn
	r    *reporter
	done atomic.Bool // the handshake finished, or its failure was reported

	mu          sync.Mutex
	in, out     records
	notTLS      bool  // the first byte from the client was no handshake record
	hello       bool  // a whole first record arrived from the client
	serverSpoke bool  // the server wrote a record
	serverAlert bool  // the server wrote a plaintext alert (refused the hello)
	clientAfter bool  // the client sent an alert or an encrypted record after the server spoke
	readErr     error // the last read error
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.done.Load() {
		return n, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.in.total == 0 && n > 0 && p[0] != recordHandshake {
		c.notTLS = true
	}
	if !c.notTLS {
		c.in.feed(p[:n], c.fromClient)
	}
	if err != nil {
		c.readErr = err
	}
	return n, err
}

func (c *conn) fromClient(typ byte) {
	switch {
	case !c.serverSpoke:
		c.hello = true
	case typ == recordAlert || typ == recordApplicationData:
		c.clientAfter = true
	}
}

func (c *conn) Write(p []byte) (int, error) {
	if !c.done.Load() {
		c.mu.Lock()
		c.out.feed(p, c.fromServer)
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *conn) fromServer(typ byte) {
	if typ == recordAlert && !c.serverSpoke {
		c.serverAlert = true
	}
	if typ == recordApplicationData && c.clientAfter {
		c.done.Store(true) // finished: the client's Finished was answered
	}
	c.serverSpoke = true
}

func (c *conn) Close() error {
	if !c.done.Load() {
		c.mu.Lock()
		cause := c.cause()
		c.mu.Unlock()
		if c.done.CompareAndSwap(false, true) {
			c.r.failed(cause, c.RemoteAddr())
		}
	}
	return c.Conn.Close()
}

// cause says where an unfinished handshake stopped.
func (c *conn) cause() string {
	var ne net.Error
	switch {
	case c.notTLS:
		return metrics.HandshakeNotTLS
	case errors.Is(c.readErr, os.ErrDeadlineExceeded) || (errors.As(c.readErr, &ne) && ne.Timeout()):
		return metrics.HandshakeTimeout
	case !c.hello:
		return metrics.HandshakeIncomplete
	case c.serverAlert || !c.serverSpoke:
		return metrics.HandshakeServerRefused
	case c.clientAfter:
		return metrics.HandshakeClientAlert
	default:
		return metrics.HandshakeClientClosed
	}
}

// records follows the record boundaries of one direction.
type records struct {
	total int     // bytes seen
	hdr   [5]byte // the header being read
	hdrN  int     // header bytes read
	body  int     // body bytes still to skip
}

// feed consumes p, calling done with the type of each record completed.
func (r *records) feed(p []byte, done func(typ byte)) {
	r.total += len(p)
	for len(p) > 0 {
		if r.hdrN < len(r.hdr) {
			k := copy(r.hdr[r.hdrN:], p)
			r.hdrN += k
			p = p[k:]
			if r.hdrN < len(r.hdr) {
				return
			}
			r.body = int(r.hdr[3])<<8 | int(r.hdr[4])
		}
		k := min(r.body, len(p))
		r.body -= k
		p = p[k:]
		if r.body == 0 {
			done(r.hdr[0])
			r.hdrN = 0
		}
	}
}

// reporter counts every failure and logs one line per cause per
// LogEvery, naming how many it did not log.
type reporter struct {
	cfg  Config
	mu   sync.Mutex
	last map[string]*logState
}

type logState struct {
	at         time.Time
	suppressed int
}

// why explains each cause in the log line.
var why = map[string]string{
	metrics.HandshakeClientAlert:   "TLS handshake failed: the client rejected the verifier's certificate (an agent whose pin matches no certificate served?)",
	metrics.HandshakeClientClosed:  "TLS handshake failed: the client hung up after the verifier's certificate",
	metrics.HandshakeServerRefused: "TLS handshake failed: the client's hello was refused (no TLS 1.3, no common cipher or protocol)",
	metrics.HandshakeNotTLS:        "TLS handshake failed: the client did not speak TLS",
	metrics.HandshakeIncomplete:    "TLS handshake failed: the connection closed before a whole hello",
	metrics.HandshakeTimeout:       "TLS handshake failed: it did not finish in time",
}

func (r *reporter) failed(cause string, peer net.Addr) {
	if r.cfg.OnFailure != nil {
		r.cfg.OnFailure(cause)
	}
	now := r.cfg.Now()
	r.mu.Lock()
	s := r.last[cause]
	if s == nil {
		s = &logState{}
		r.last[cause] = s
	}
	if !s.at.IsZero() && now.Sub(s.at) < r.cfg.LogEvery {
		s.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := s.suppressed
	s.at, s.suppressed = now, 0
	r.mu.Unlock()
	level := slog.LevelWarn
	if cause == metrics.HandshakeIncomplete || cause == metrics.HandshakeNotTLS {
		level = slog.LevelInfo // scanners and TCP health checks
	}
	addr := ""
	if peer != nil {
		addr = peer.String()
	}
	r.cfg.Logger.Log(context.Background(), level, why[cause], logkey.Cause, cause, logkey.Peer, addr, logkey.Suppressed, suppressed)
}
