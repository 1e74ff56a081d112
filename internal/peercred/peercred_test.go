package peercred

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/internal/logtest"
)

// The uid and groups the child client runs as: nobody, plus a group that
// exists only for this test.
const (
	childUID     = 65534
	childGID     = 65534
	allowedGroup = 4242
)

// TestMain lets the test binary be the client process of another uid.
func TestMain(m *testing.M) {
	if sock := os.Getenv("PEERCRED_TEST_CHILD_SOCKET"); sock != "" {
		if os.Getenv("PEERCRED_TEST_CHILD_RAW") != "" {
			os.Exit(rawChild(sock))
		}
		os.Exit(childClient(sock))
	}
	os.Exit(m.Run())
}

// rawChild connects without gRPC, sends the HTTP/2 client preface, and
// prints how many bytes the server sent before it closed the connection
// and how that read ended.
func rawChild(sock string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")) // failing is being closed too
	n, err := io.Copy(io.Discard, c)
	// Closed before the preface was read: EOF, or a reset when the
	// unread preface was still queued. Either is "closed".
	if errors.Is(err, syscall.ECONNRESET) {
		err = nil
	}
	fmt.Printf("read=%d closed=%v\n", n, err == nil)
	return 0
}

// childClient calls the health service on sock and prints the status code.
func childClient(sock string) int {
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(ClientCredentials()))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Printf("code=%s pid=%d\n", status.Code(err), os.Getpid())
	return 0
}

// recorder remembers the credentials the last admitted call carried.
type recorder struct {
	mu    sync.Mutex
	creds []Creds
}

func (r *recorder) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c, ok := FromContext(ctx)
	if !ok {
		return nil, errors.New("handler context has no peer credentials")
	}
	r.mu.Lock()
	r.creds = append(r.creds, c)
	r.mu.Unlock()
	return h(ctx, req)
}

func (r *recorder) all() []Creds {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.creds)
}

// serve starts a health server behind p on a socket other users may reach
// and returns the socket path and the directory (world-readable, for the
// child's copy of the test binary).
func serve(t *testing.T, p Policy, rec *recorder) (sock, dir string) {
	return serveLogged(t, p, rec, nil)
}

// serveLogged is serve with the server's log written to log.
func serveLogged(t *testing.T, p Policy, rec *recorder, log *slog.Logger) (sock, dir string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "peercred-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(dir, "admin.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o666); err != nil { // the policy, not the mode, decides here
		t.Fatal(err)
	}
	opts := append(ServerOptions(p, log), grpc.ChainUnaryInterceptor(rec.interceptor))
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return sock, dir
}

// runAs runs the test binary as a client under uid/gid/groups and returns
// what it printed and its pid.
func runAs(t *testing.T, dir, sock string, groups []uint32, env ...string) (string, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the client under another uid")
	}
	bin := filepath.Join(dir, "client")
	if _, err := os.Stat(bin); err != nil {
		copyExecutable(t, bin)
	}
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PEERCRED_TEST_CHILD_SOCKET=" + sock}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: childUID, Gid: childGID, Groups: groups}}
	// The answer is read from stdout alone: stderr carries what the
	// runtime has to say, e.g. a binary built by `go test -cover` warns
	// there that the child (without GOCOVERDIR) writes no coverage data.
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("client: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	return strings.TrimSpace(string(out)), cmd.Process.Pid
}

func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// A caller the policy refuses is refused in the transport handshake: its
// connection is closed before the server reads a byte of it (the raw
// client's preface is never answered: no server preface, no SETTINGS),
// its call fails as the connection's, no handler runs, and its uid is
// logged once however often it tries.
func TestOtherUIDIsRefused(t *testing.T) {
	rec := &recorder{}
	logs := &logtest.Buffer{}
	sock, dir := serveLogged(t, Policy{Groups: []uint32{allowedGroup}}, rec, slog.New(slog.NewTextHandler(logs, nil)))
	out, pid := runAs(t, dir, sock, nil)
	if want := fmt.Sprintf("code=Unavailable pid=%d", pid); out != want {
		t.Fatalf("client as uid %d got %q, want %q", childUID, out, want)
	}
	raw, _ := runAs(t, dir, sock, nil, "PEERCRED_TEST_CHILD_RAW=1")
	if raw != "read=0 closed=true" {
		t.Fatalf("raw client as uid %d: %q, want the connection closed with nothing sent", childUID, raw)
	}
	if got := rec.all(); len(got) != 0 {
		t.Fatalf("a refused call reached the handler with %v", got)
	}
	line := fmt.Sprintf(`msg="local API connection refused (logged once per uid)" uid=%d gid=%d pid=%d why="not root nor in an allowed group"`,
		childUID, childGID, pid)
	if n := strings.Count(logs.String(), "local API connection refused"); n != 1 || !strings.Contains(logs.String(), line) {
		t.Fatalf("want one refusal line %s, got %d:\n%s", line, n, logs)
	}
	// Slips past a check that looks at the group alone: gid 0 without
	// uid 0 is still refused.
	out, pid = runAsGID(t, dir, sock, 0)
	if want := fmt.Sprintf("code=Unavailable pid=%d", pid); out != want {
		t.Fatalf("client as uid %d gid 0 got %q, want %q", childUID, out, want)
	}
}

// runAsGID is runAs with primary group gid and no supplementary groups.
func runAsGID(t *testing.T, dir, sock string, gid uint32) (string, int) {
	t.Helper()
	bin := filepath.Join(dir, "client")
	cmd := exec.Command(bin)
	cmd.Env = []string{"PEERCRED_TEST_CHILD_SOCKET=" + sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: childUID, Gid: gid, Groups: []uint32{}}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("client: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	return strings.TrimSpace(string(out)), cmd.Process.Pid
}

func TestAllowedGroupCarriesCallerCreds(t *testing.T) {
	rec := &recorder{}
	sock, dir := serve(t, Policy{Groups: []uint32{allowedGroup}}, rec)
	out, pid := runAs(t, dir, sock, []uint32{allowedGroup})
	if want := fmt.Sprintf("code=OK pid=%d", pid); out != want {
		t.Fatalf("client in group %d got %q, want %q", allowedGroup, out, want)
	}
	got := rec.all()
	if len(got) != 1 {
		t.Fatalf("handler saw %d calls, want 1", len(got))
	}
	c := got[0]
	if c.UID != childUID || c.GID != childGID || c.PID != int32(pid) || !slices.Contains(c.Groups, allowedGroup) {
		t.Fatalf("handler saw %v groups %v; want uid=%d gid=%d pid=%d with group %d",
			c, c.Groups, childUID, childGID, pid, allowedGroup)
	}
}

func TestZeroPolicyAdmitsRootOnly(t *testing.T) {
	rec := &recorder{}
	sock, dir := serve(t, Policy{}, rec)
	out, pid := runAs(t, dir, sock, []uint32{allowedGroup})
	if want := fmt.Sprintf("code=Unavailable pid=%d", pid); out != want {
		t.Fatalf("zero policy: client got %q, want %q", out, want)
	}
	// The test process itself is root: admitted, with its own pid.
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(ClientCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("root refused: %v", err)
	}
	got := rec.all()
	if len(got) != 1 || got[0].UID != 0 || got[0].PID != int32(os.Getpid()) {
		t.Fatalf("handler saw %v, want uid=0 pid=%d", got, os.Getpid())
	}
}

func TestPolicyAllow(t *testing.T) {
	p := Policy{Groups: []uint32{990}}
	cases := []struct {
		name  string
		creds Creds
		allow bool
	}{
		{"root", Creds{UID: 0, GID: 0}, true},
		{"root with other gid", Creds{UID: 0, GID: 1000}, true},
		{"primary group", Creds{UID: 1000, GID: 990}, true},
		{"supplementary group", Creds{UID: 1000, GID: 1000, Groups: []uint32{27, 990}}, true},
		{"other user", Creds{UID: 1000, GID: 1000, Groups: []uint32{27}}, false},
		{"gid 0 but not root", Creds{UID: 1000, GID: 0}, false},
	}
	for _, c := range cases {
		err := p.Allow(c.creds)
		if c.allow && err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		}
		if !c.allow && status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: got %v, want PermissionDenied", c.name, err)
		}
	}
}

// TestSocketpairCarriesOwnCreds reads the credentials of a socket pair made
// by this process: both ends carry its own uid, gid and pid.
func TestSocketpairCarriesOwnCreds(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := fileConn(t, fds[0]), fileConn(t, fds[1])
	defer a.Close()
	defer b.Close()
	_, ai, err := NewTransportCredentials().ServerHandshake(a)
	if err != nil {
		t.Fatal(err)
	}
	c := ai.(AuthInfo).Creds
	if c.UID != uint32(os.Getuid()) || c.GID != uint32(os.Getgid()) || c.PID != int32(os.Getpid()) {
		t.Fatalf("got %v, want uid=%d gid=%d pid=%d", c, os.Getuid(), os.Getgid(), os.Getpid())
	}
	if ai.(AuthInfo).SecurityLevel != credentials.PrivacyAndIntegrity {
		t.Fatalf("security level %v", ai.(AuthInfo).SecurityLevel)
	}
}

func fileConn(t *testing.T, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTCPConnectionFailsHandshake(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, err := NewTransportCredentials().ServerHandshake(c); !errors.Is(err, ErrNotUnix) {
		t.Fatalf("TCP handshake: got %v, want ErrNotUnix", err)
	}
}

func TestLookupGroup(t *testing.T) {
	if g, err := LookupGroup("4242"); err != nil || g != 4242 {
		t.Fatalf("LookupGroup(4242) = %d, %v", g, err)
	}
	if g, err := LookupGroup("root"); err != nil || g != 0 {
		t.Fatalf("LookupGroup(root) = %d, %v", g, err)
	}
	if _, err := LookupGroup("no-such-group-latchkey"); err == nil {
		t.Fatal("LookupGroup of a missing group succeeded")
	}
}
