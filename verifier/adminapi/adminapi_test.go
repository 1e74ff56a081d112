package adminapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/localapi/localapitest"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// fakeTokens holds tokens in memory; failList switches List to an error.
type fakeTokens struct {
	mu       sync.Mutex
	tokens   map[string]*adminv1.Token
	failList bool
}

func (f *fakeTokens) List(context.Context) ([]*adminv1.Token, []*adminv1.SkippedRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failList {
		return nil, nil, errors.New("apiserver unreachable")
	}
	var out []*adminv1.Token
	for _, t := range f.tokens {
		out = append(out, t)
	}
	return out, nil, nil
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

// start serves the verifier's admin service on a fresh socket.
func start(t *testing.T, tokens Tokens, policies PolicyChecker) *grpc.ClientConn {
	return startWith(t, tokens, policies, nil)
}

func startWith(t *testing.T, tokens Tokens, policies PolicyChecker, bindings Bindings) *grpc.ClientConn {
	t.Helper()
	return localapitest.Start(t, localapi.Config{Services: []localapi.Service{Service(tokens, policies, bindings)}})
}

func TestTokensRoundTrip(t *testing.T) {
	tokens := &fakeTokens{tokens: map[string]*adminv1.Token{
		"abcdef": {Id: "abcdef", NodeName: "worker-1", Role: latchkeyv1.Role_ROLE_WORKER, ExpiryUnix: 1_790_001_800},
	}}
	c := adminv1.NewVerifierAdminClient(start(t, tokens, fakeChecker{}))
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
	c := adminv1.NewVerifierAdminClient(start(t, nil, fakeChecker{}))
	_, err := c.ListTokens(context.Background(), &adminv1.ListTokensRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
}

func TestCheckPolicyRoundTrip(t *testing.T) {
	c := adminv1.NewVerifierAdminClient(start(t, nil, fakeChecker{}))
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

func TestWriteTokensMarksMalformedExpiry(t *testing.T) {
	now := time.Unix(1_790_000_000, 0)
	var buf bytes.Buffer
	err := WriteTokens(&buf, []*adminv1.Token{
		{Id: "aaaaaa", NodeName: "w1", Role: latchkeyv1.Role_ROLE_WORKER, CreatedUnix: now.Unix() - 300, ExpiryUnix: now.Unix() + 1500},
		{Id: "bbbbbb", NodeName: "w2", ExpirationMalformed: true, RawExpiration: "tomorrow"},
		{Id: "cccccc", NodeName: "w3", ExpiryUnix: now.Unix() - 60},
		{Id: "dddddd", NodeName: "w4"},
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
		"dddddd  w4    -       -     unknown",
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

func (f *fakeBindings) List(context.Context) ([]*adminv1.Binding, []*adminv1.SkippedRecord, error) {
	return []*adminv1.Binding{{Kind: adminv1.BindingKind_BINDING_KIND_NODE, Name: "worker-1", Identity: "tpm-ek:sha256:ab", TokenId: "abcdef", CreatedUnix: 1_790_000_000}}, nil, nil
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
	c := adminv1.NewVerifierAdminClient(startWith(t, nil, nil, fb))
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
