package peercred

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"

	"google.golang.org/grpc/credentials"

	"github.com/latchkey/latchkey/internal/logkey"
)

// maxLoggedCallers bounds the set of callers whose refusal was logged
// (uids are few on a real host; the bound keeps a caller cycling through
// uids from growing it without end).
const maxLoggedCallers = 1024

// serverTransport checks the caller in the transport handshake: before
// gRPC reads a single byte of the connection (its preface, headers or any
// message), the kernel's record of the peer is compared with the policy,
// and a caller the policy refuses has its connection closed. A refused
// caller therefore costs the server one getsockopt and one close, however
// large the request it meant to send.
type serverTransport struct {
	transport
	policy Policy
	once   *onceLog
}

// NewServerCredentials returns transport credentials that refuse, in the
// handshake, every caller p does not allow, logging each refused uid
// once (log may be nil: no log).
func NewServerCredentials(p Policy, log *slog.Logger) credentials.TransportCredentials {
	return serverTransport{policy: p, once: newOnceLog(log)}
}

func (s serverTransport) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, ai, err := handshake(conn)
	if err != nil {
		return nil, nil, err
	}
	if err := s.policy.Allow(ai.(AuthInfo).Creds); err != nil {
		s.once.refused(ai.(AuthInfo).Creds, "not root nor in an allowed group")
		return nil, nil, fmt.Errorf("peercred: caller %v refused: %w", ai.(AuthInfo).Creds, err)
	}
	return c, ai, nil
}

func (s serverTransport) Clone() credentials.TransportCredentials { return s }

// onceLog writes one line per refused (uid, why): enough for an operator
// to see who is knocking, without one line per attempt.
type onceLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	seen map[onceKey]bool
}

type onceKey struct {
	uid uint32
	why string
}

func newOnceLog(log *slog.Logger) *onceLog {
	return &onceLog{log: log, seen: map[onceKey]bool{}}
}

// refused logs c's refusal for why unless it was logged before.
func (o *onceLog) refused(c Creds, why string) {
	if o == nil || o.log == nil {
		return
	}
	k := onceKey{c.UID, why}
	o.mu.Lock()
	first := !o.seen[k] && len(o.seen) < maxLoggedCallers
	if first {
		o.seen[k] = true
	}
	o.mu.Unlock()
	if first {
		o.log.Warn("local API connection refused (logged once per uid)", logkey.UID, c.UID, logkey.GID, c.GID,
			logkey.PID, c.PID, logkey.Why, why)
	}
}

// LimitListener caps the open connections of l at n: a connection past
// the cap is closed at once (the caller sees it closed, and may retry),
// not queued, and its caller's uid is logged once. Connections refused in
// the handshake are closed at once too, so only admitted callers can hold
// the places.
func LimitListener(l net.Listener, n int, log *slog.Logger) net.Listener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), once: newOnceLog(log)}
}

type limitListener struct {
	net.Listener
	sem  chan struct{}
	once *onceLog
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &limitConn{Conn: c, release: sync.OnceFunc(func() { <-l.sem })}, nil
		default:
			if cr, err := Read(c); err == nil {
				l.once.refused(cr, fmt.Sprintf("at the limit of %d connections", cap(l.sem)))
			}
			c.Close()
		}
	}
}

// limitConn gives its place back when closed. It keeps the Unix socket's
// SyscallConn reachable, so the handshake can read the peer credentials.
type limitConn struct {
	net.Conn
	release func()
}

// SyscallConn is the Unix socket's, for Read.
func (c *limitConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, ErrNotUnix
	}
	return sc.SyscallConn()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
