package localapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

type fakeAgent struct{ st *adminv1.AgentStatus }

func (f fakeAgent) Status() *adminv1.AgentStatus { return proto.Clone(f.st).(*adminv1.AgentStatus) }

// fakeTokens holds tokens in memory; failList switches List to an error.
type fakeTokens struct {
	mu       sync.Mutex
	tokens   map[string]*adminv1.Token
	failList bool
}

func (f *fakeTokens) List(context.Context) ([]*adminv1.Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failList {
		return nil, errors.New("apiserver unreachable")
	}
	var out []*adminv1.Token
	for _, t := range f.tokens {
		out = append(out, t)
	}
	return out, nil
}

func (f *fakeTokens) Revoke(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.tokens[id]; !ok {
		return fmt.Errorf("secret bootstrap-token-%s: %w", id, ErrTokenNotFound)
	}
	delete(f.tokens, id)
	return nil
}

type fakeChecker struct{}

func (fakeChecker) Check(_ context.Context, policy []byte) (string, error) {
	if !bytes.HasPrefix(policy, []byte("apiVersion: latchkey/v1")) {
		return "", errors.New(`line 1: apiVersion: want "latchkey/v1"`)
	}
	return "sha256:00ff", nil
}

// start serves cfg on a fresh socket and returns a connected client.
func start(t *testing.T, cfg Config) *grpc.ClientConn {
	t.Helper()
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "run", "admin.sock")
	l, err := Listen(SocketConfig{Path: path})
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
	conn, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestAgentStatusRoundTrip(t *testing.T) {
	want := &adminv1.AgentStatus{
		Stage: adminv1.Stage_STAGE_ATTESTING, StageSinceUnix: 1_790_000_000, Attempt: 3,
		VerifierEndpoint: "verifier-1:7443", LastError: "connection refused",
		LastReason: latchkeyv1.Reason_UNAVAILABLE, NodeName: "worker-1",
		DiskUuid: "0b5e6f6e-4b8c-4f51-9d7e-5f1c2b3a4d5e", Variant: latchkeyv1.Variant_VARIANT_TPM,
		StatusLine: "attesting to verifier-1:7443 (attempt 3)",
	}
	conn := start(t, Config{Agent: fakeAgent{want}})
	got, err := adminv1.NewAgentAdminClient(conn).Status(context.Background(), &adminv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// The agent serves no verifier methods.
	_, err = adminv1.NewVerifierAdminClient(conn).ListTokens(context.Background(), &adminv1.ListTokensRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListTokens on the agent: got %v, want Unimplemented", err)
	}
}

func TestTokensRoundTrip(t *testing.T) {
	tokens := &fakeTokens{tokens: map[string]*adminv1.Token{
		"abcdef": {Id: "abcdef", NodeName: "worker-1", Role: latchkeyv1.Role_ROLE_WORKER, ExpiryUnix: 1_790_001_800},
	}}
	c := adminv1.NewVerifierAdminClient(start(t, Config{Tokens: tokens, Policies: fakeChecker{}}))
	ctx := context.Background()
	list, err := c.ListTokens(ctx, &adminv1.ListTokensRequest{})
	if err != nil || len(list.GetTokens()) != 1 || list.GetTokens()[0].GetNodeName() != "worker-1" {
		t.Fatalf("ListTokens = %v, %v", list, err)
	}
	cases := []struct {
		id   string
		code codes.Code
	}{
		{"abcdef", codes.OK},
		{"abcdef", codes.NotFound}, // already gone
		{"ABCDEF", codes.InvalidArgument},
		{"abcdef.0123456789abcdef", codes.InvalidArgument}, // a whole token, secret included
		{"", codes.InvalidArgument},
	}
	for _, tc := range cases {
		_, err := c.RevokeToken(ctx, &adminv1.RevokeTokenRequest{Id: tc.id})
		if status.Code(err) != tc.code {
			t.Errorf("RevokeToken(%q): got %v, want %v", tc.id, err, tc.code)
		}
	}
	tokens.failList = true
	if _, err := c.ListTokens(ctx, &adminv1.ListTokensRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ListTokens with the API server down: got %v, want Unavailable", err)
	}
}

func TestDiskOnlyVerifierHasNoTokens(t *testing.T) {
	c := adminv1.NewVerifierAdminClient(start(t, Config{Policies: fakeChecker{}}))
	_, err := c.ListTokens(context.Background(), &adminv1.ListTokensRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
}

func TestCheckPolicyRoundTrip(t *testing.T) {
	c := adminv1.NewVerifierAdminClient(start(t, Config{Policies: fakeChecker{}}))
	ctx := context.Background()
	good, err := c.CheckPolicy(ctx, &adminv1.CheckPolicyRequest{Policy: []byte("apiVersion: latchkey/v1\n")})
	if err != nil || !good.GetValid() || good.GetDigest() != "sha256:00ff" {
		t.Fatalf("good policy: %v, %v", good, err)
	}
	bad, err := c.CheckPolicy(ctx, &adminv1.CheckPolicyRequest{Policy: []byte("apiVersion: v0\n")})
	if err != nil || bad.GetValid() || !strings.Contains(bad.GetError(), "apiVersion") {
		t.Fatalf("bad policy: %v, %v", bad, err)
	}
	huge := bytes.Repeat([]byte("x"), MaxPolicySize+1)
	if _, err := c.CheckPolicy(ctx, &adminv1.CheckPolicyRequest{Policy: huge}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("oversized policy: got %v, want InvalidArgument", err)
	}
}

func TestNewServerNeedsSomethingToServe(t *testing.T) {
	if _, err := NewServer(Config{}); err == nil {
		t.Fatal("NewServer with nothing to serve succeeded")
	}
}

func TestListenModes(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		cfg  SocketConfig
		mode os.FileMode
	}{
		{SocketConfig{Path: filepath.Join(dir, "a.sock")}, 0o600},
		{SocketConfig{Path: filepath.Join(dir, "b.sock"), Group: "0"}, 0o660},
		{SocketConfig{Path: filepath.Join(dir, "c.sock"), Mode: 0o666}, 0o666},
	}
	for _, tc := range cases {
		l, err := Listen(tc.cfg)
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
	if _, err := Listen(SocketConfig{Path: "relative.sock"}); err == nil {
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
	l2, err := Listen(SocketConfig{Path: stale})
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer l2.Close()
	if _, err := Listen(SocketConfig{Path: stale}); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("live socket: got %v, want 'served by another process'", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(SocketConfig{Path: file}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: got %v, want 'not a socket'", err)
	}
}

func TestWriteStatus(t *testing.T) {
	now := time.Unix(1_790_000_100, 0)
	var buf bytes.Buffer
	err := WriteStatus(&buf, &adminv1.AgentStatus{
		Stage: adminv1.Stage_STAGE_FAILED, StageSinceUnix: 1_790_000_040, Attempt: 1,
		VerifierEndpoint: "v1:7443", LastError: "pcr 7 holds an unlisted value",
		LastReason: latchkeyv1.Reason_PCR_MISMATCH, ExitCode: 3, Rejoin: true, DiskUuid: "u-1",
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stage:       failed (for 1m0s)",
		"state disk:  u-1 (rejoin)",
		"last error:  pcr 7 holds an unlisted value [PCR_MISMATCH]",
		"exit code:   3 (refused-by-policy)",
	} {
		if !strings.Contains(buf.String(), want+"\n") {
			t.Errorf("status output lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestWriteTokensMarksMalformedExpiry(t *testing.T) {
	now := time.Unix(1_790_000_000, 0)
	var buf bytes.Buffer
	err := WriteTokens(&buf, []*adminv1.Token{
		{Id: "aaaaaa", NodeName: "w1", Role: latchkeyv1.Role_ROLE_WORKER, CreatedUnix: now.Unix() - 300, ExpiryUnix: now.Unix() + 1500},
		{Id: "bbbbbb", NodeName: "w2", ExpirationMalformed: true, RawExpiration: "tomorrow"},
		{Id: "cccccc", NodeName: "w3", ExpiryUnix: now.Unix() - 60},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		"ID      NODE  ROLE    AGE   EXPIRES",
		"aaaaaa  w1    worker  5m0s  in 25m0s",
		`bbbbbb  w2    -       -     MALFORMED "tomorrow" (never expires; revoke it)`,
		"cccccc  w3    -       -     expired 1m0s ago",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// fakeBindings records the by of each release.
type fakeBindings struct {
	mu sync.Mutex
	by []string
}

func (f *fakeBindings) List(context.Context) ([]*adminv1.Binding, error) {
	return []*adminv1.Binding{{Kind: adminv1.BindingKind_BINDING_KIND_NODE, Name: "worker-1", Identity: "tpm-ek:sha256:ab", TokenId: "abcdef", CreatedUnix: 1_790_000_000}}, nil
}

func (f *fakeBindings) Release(_ context.Context, k adminv1.BindingKind, name, by string) (*adminv1.Binding, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch name {
	case "worker-1":
		f.by = append(f.by, by)
		return &adminv1.Binding{Kind: k, Name: name, Identity: "tpm-ek:sha256:ab"}, nil
	case "Bad_Name":
		return nil, fmt.Errorf("%w: node name", ErrBadBinding)
	}
	return nil, fmt.Errorf("%w: %s", ErrBindingNotFound, name)
}

func TestBindingsRoundTrip(t *testing.T) {
	fb := &fakeBindings{}
	c := adminv1.NewVerifierAdminClient(start(t, Config{Bindings: fb}))
	ctx := context.Background()
	list, err := c.ListBindings(ctx, &adminv1.ListBindingsRequest{})
	if err != nil || len(list.GetBindings()) != 1 {
		t.Fatalf("ListBindings = %v, %v", list, err)
	}
	cases := []struct {
		kind adminv1.BindingKind
		name string
		code codes.Code
	}{
		{adminv1.BindingKind_BINDING_KIND_NODE, "worker-1", codes.OK},
		{adminv1.BindingKind_BINDING_KIND_NODE, "worker-2", codes.NotFound},
		{adminv1.BindingKind_BINDING_KIND_NODE, "Bad_Name", codes.InvalidArgument},
		{adminv1.BindingKind_BINDING_KIND_UNSPECIFIED, "worker-1", codes.InvalidArgument},
	}
	for _, tc := range cases {
		_, err := c.ReleaseBinding(ctx, &adminv1.ReleaseBindingRequest{Kind: tc.kind, Name: tc.name})
		if status.Code(err) != tc.code {
			t.Errorf("ReleaseBinding(%v, %q): got %v, want %v", tc.kind, tc.name, err, tc.code)
		}
	}
	if len(fb.by) != 1 || !strings.HasPrefix(fb.by[0], fmt.Sprintf("admin uid=%d pid=", os.Getuid())) {
		t.Fatalf("release by %q, want the caller's uid and pid", fb.by)
	}
	var out bytes.Buffer
	if err := WriteBindings(&out, append(list.GetBindings(), &adminv1.Binding{Kind: adminv1.BindingKind_BINDING_KIND_DISK,
		Name: "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e", ReleasedUnix: 1_790_000_000, ReleasedBy: "admin uid=0 pid=7"}), time.Unix(1_790_000_060, 0)); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "node  worker-1") || !strings.Contains(s, "released 1m0s ago by admin uid=0 pid=7") {
		t.Fatalf("table:\n%s", s)
	}
}
