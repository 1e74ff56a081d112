package localapi_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/localapi/localapitest"
)

// healthService is a service to serve: gRPC's own health service.
func healthService(s *grpc.Server, _ *slog.Logger) {
	healthpb.RegisterHealthServer(s, health.NewServer())
}

func TestServesItsServices(t *testing.T) {
	conn := localapitest.Start(t, localapi.Config{Services: []localapi.Service{healthService}})
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check = %v, %v", resp, err)
	}
}

func TestNewServerNeedsSomethingToServe(t *testing.T) {
	_, err := localapi.NewServer(localapi.Config{})
	if err == nil || err.Error() != "localapi: nothing to serve: no admin service" {
		t.Fatalf("NewServer with nothing to serve: %v", err)
	}
}

func TestListenModes(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		cfg  localapi.SocketConfig
		mode os.FileMode
	}{
		{localapi.SocketConfig{Path: filepath.Join(dir, "a.sock")}, 0o600},
		{localapi.SocketConfig{Path: filepath.Join(dir, "b.sock"), Group: "0"}, 0o660},
		{localapi.SocketConfig{Path: filepath.Join(dir, "c.sock"), Mode: 0o666}, 0o666},
	}
	for _, tc := range cases {
		l, err := localapi.Listen(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(tc.cfg.Path)
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != tc.mode {
			t.Errorf("%s: mode %v, want %v", tc.cfg.Path, fi.Mode().Perm(), tc.mode)
		}
	}
	if _, err := localapi.Listen(localapi.SocketConfig{Path: "relative.sock"}); err == nil {
		t.Error("Listen accepted a relative path")
	}
}

func TestListenReplacesOnlyStaleSockets(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // leaves the file, like a crashed process
	l2, err := localapi.Listen(localapi.SocketConfig{Path: stale})
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer l2.Close()
	if _, err := localapi.Listen(localapi.SocketConfig{Path: stale}); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("live socket: got %v, want 'served by another process'", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := localapi.Listen(localapi.SocketConfig{Path: file}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: got %v, want 'not a socket'", err)
	}
}

func TestTableCells(t *testing.T) {
	now := time.Unix(1_790_000_100, 0)
	if got := localapi.Ago(now, 1_790_000_040); got != "1m0s" {
		t.Errorf("localapi.Ago(60s before) = %q", got)
	}
	if got := localapi.Ago(now, 1_790_000_200); got != "0s" {
		t.Errorf("localapi.Ago(in the future) = %q", got)
	}
	if localapi.OrDash("") != "-" || localapi.OrDash("x") != "x" {
		t.Errorf("OrDash = %q, %q", localapi.OrDash(""), localapi.OrDash("x"))
	}
}
