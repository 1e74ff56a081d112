// Package localapitest serves an admin API on a socket for tests. Test
// code only: the shipped binaries must not link it.
package localapitest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/latchkey/latchkey/internal/localapi"
)

// Start serves cfg on a fresh socket in a test directory and returns a
// client connected to it; both are closed when the test ends.
func Start(t *testing.T, cfg localapi.Config) *grpc.ClientConn {
	t.Helper()
	srv, err := localapi.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "run", "admin.sock")
	l, err := localapi.Listen(localapi.SocketConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Stop(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := localapi.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
