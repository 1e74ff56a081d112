package connlimit

import (
	"net"
	"testing"
	"time"
)

// acceptAll accepts on l until it closes, keeping every connection open.
func acceptAll(l net.Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	return ch
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByPeer reports whether the server side closed c.
func closedByPeer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestPerSourceLimitClosesTheExtraConnections(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan bool, 8)
	l := Wrap(inner, Config{MaxConnections: 100, MaxConnectionsPerSource: 3, OnRefused: func(p bool) { refused <- p }})
	defer l.Close()
	accepted := acceptAll(l)
	for range 3 {
		dial(t, l.Addr().String())
		<-accepted
	}
	extra := dial(t, l.Addr().String())
	if !closedByPeer(extra) {
		t.Fatal("a fourth connection from one source was kept open")
	}
	if p := <-refused; !p || l.Refused() != 1 || l.Open() != 3 {
		t.Fatalf("refused per source %v, count %d, open %d", p, l.Refused(), l.Open())
	}
}

func TestTotalLimitAndRelease(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Wrap(inner, Config{MaxConnections: 2, MaxConnectionsPerSource: 10})
	defer l.Close()
	accepted := acceptAll(l)
	dial(t, l.Addr().String())
	first := <-accepted
	dial(t, l.Addr().String())
	<-accepted
	if extra := dial(t, l.Addr().String()); !closedByPeer(extra) {
		t.Fatal("a third connection over the total limit was kept open")
	}
	first.Close()
	first.Close() // a second close must not free a second slot
	if l.Open() != 1 {
		t.Fatalf("open = %d after one close, want 1", l.Open())
	}
	dial(t, l.Addr().String())
	select {
	case c := <-accepted:
		if c == nil {
			t.Fatal("listener closed")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a connection within the limit again was not accepted")
	}
	if l.Open() != 2 || l.Refused() != 1 {
		t.Fatalf("open %d refused %d, want 2 and 1", l.Open(), l.Refused())
	}
}

func TestDefaults(t *testing.T) {
	l := Wrap(nil, Config{})
	if l.cfg.MaxConnections != DefaultMaxConnections || l.cfg.MaxConnectionsPerSource != DefaultMaxConnectionsPerSource {
		t.Fatalf("defaults %+v", l.cfg)
	}
}
