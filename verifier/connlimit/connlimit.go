// Package connlimit bounds the connections an unauthenticated peer can
// hold open on the verifier's join port. Every join is one short
// connection, so a bound in the hundreds per source and in the thousands
// in all costs a real fleet nothing, while a flood of idle or slow
// connections can no longer grow the verifier's memory without limit.
//
// The limits are applied at Accept: a connection over a limit is closed at
// once, before the TLS handshake, and counted. Sources are IP addresses
// (an IPv6 address counts whole; a /64 would be kinder to NAT64 fleets
// but is not needed for the loopback and cluster networks latchkey runs
// on today).
package connlimit

import (
	"net"
	"sync"
	"sync/atomic"
)

// Defaults, used for a zero Config field.
const (
	DefaultMaxConnections          = 4096
	DefaultMaxConnectionsPerSource = 256
)

// Config bounds a listener.
type Config struct {
	// MaxConnections bounds open connections in all (default 4096).
	MaxConnections int
	// MaxConnectionsPerSource bounds open connections from one IP address
	// (default 256: an agent needs one; NAT gateways put many behind one
	// address).
	MaxConnectionsPerSource int
	// OnRefused is told of each connection closed over a limit (for a
	// metric); optional. perSource says which limit it hit.
	OnRefused func(perSource bool)
}

// Listener is a net.Listener with connection limits.
type Listener struct {
	net.Listener
	cfg Config

	mu     sync.Mutex
	total  int
	source map[string]int

	refused atomic.Int64
}

// Wrap bounds l.
func Wrap(l net.Listener, cfg Config) *Listener {
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.MaxConnectionsPerSource <= 0 {
		cfg.MaxConnectionsPerSource = DefaultMaxConnectionsPerSource
	}
	return &Listener{Listener: l, cfg: cfg, source: map[string]int{}}
}

// Accept returns the next connection within the limits; connections over
// a limit are closed and never returned.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		if perSource, ok := l.admit(src); !ok {
			c.Close()
			l.refused.Add(1)
			if l.cfg.OnRefused != nil {
				l.cfg.OnRefused(perSource)
			}
			continue
		}
		return &conn{Conn: c, release: func() { l.release(src) }}, nil
	}
}

// Refused is how many connections were closed over a limit.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// Open is how many connections are open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

func (l *Listener) admit(src string) (perSource, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.cfg.MaxConnections {
		return false, false
	}
	if l.source[src] >= l.cfg.MaxConnectionsPerSource {
		return true, false
	}
	l.total++
	l.source[src]++
	return false, true
}

func (l *Listener) release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.source[src]--; l.source[src] <= 0 {
		delete(l.source, src)
	}
}

func sourceOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// conn releases its slot exactly once, however often it is closed.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
