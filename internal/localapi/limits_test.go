package localapi_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logtest"
)

// serveRaw serves the health service on a fresh socket and returns its
// path and the server's log.
func serveRaw(t *testing.T) (string, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	srv, err := localapi.NewServer(localapi.Config{Services: []localapi.Service{healthService},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "admin.sock")
	l, err := localapi.Listen(localapi.SocketConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	return path, logs
}

// serverSettings connects and returns the settings of the server's
// first HTTP/2 frame (id -> value), or an error when the server closed
// the connection without sending one.
func serverSettings(t *testing.T, path string) (net.Conn, map[uint16]uint32, error) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		return c, nil, err
	}
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return c, nil, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	if hdr[3] != 0x4 || n%6 != 0 || n > 1024 {
		t.Fatalf("first frame: type %d length %d, want SETTINGS", hdr[3], n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return c, nil, err
	}
	out := map[uint16]uint32{}
	for i := 0; i < n; i += 6 {
		out[binary.BigEndian.Uint16(body[i:])] = binary.BigEndian.Uint32(body[i+2:])
	}
	return c, out, nil
}

// settingsMaxConcurrentStreams is SETTINGS_MAX_CONCURRENT_STREAMS (RFC
// 9113 6.5.2).
const settingsMaxConcurrentStreams = 0x3

// The server caps its connections at MaxConnections: one past the cap is
// closed at once, nothing sent, and the refusal logged once per uid; a
// place freed is taken again. Every admitted connection is told
// MaxStreamsPerConnection.
func TestConnectionsCapped(t *testing.T) {
	path, logs := serveRaw(t)
	var held []net.Conn
	for range localapi.MaxConnections {
		c, st, err := serverSettings(t, path)
		if err != nil {
			t.Fatalf("connection %d under the cap: %v", len(held), err)
		}
		if got := st[settingsMaxConcurrentStreams]; got != localapi.MaxStreamsPerConnection {
			t.Fatalf("MAX_CONCURRENT_STREAMS %d, want %d", got, localapi.MaxStreamsPerConnection)
		}
		held = append(held, c)
	}
	for range 2 {
		// Closed before the client's preface was read: EOF, a reset when
		// the unread preface was still queued, or a broken pipe when the
		// server had closed before the preface was written.
		if _, _, err := serverSettings(t, path); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("connection past the cap: %v, want closed with nothing sent", err)
		}
	}
	if n := strings.Count(logs.String(), `why="at the limit of 16 connections"`); n != 1 {
		t.Fatalf("over-cap refusals logged %d times, want once for this uid:\n%s", n, logs)
	}
	held[0].Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _, err := serverSettings(t, path)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a freed place was never taken again: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the server sees the close asynchronously
	}
}
