package token

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/latchkey/latchkey/internal/logtest"
)

// Mint returns the ticket only once the API server authenticates its
// token: here the third check says so.
func TestMintWaitsUntilTheTokenAuthenticates(t *testing.T) {
	fc := newFakeCluster(t, "https://10.0.0.1:6443", 1, signOnCreate)
	var mu sync.Mutex
	var seen []string
	k := newTestKube(t, fc, func(c *KubeConfig) {
		c.Authenticates = func(_ context.Context, token string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, token)
			return len(seen) == 3, nil
		}
	})
	g, err := k.Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 || seen[2] != g.Token {
		t.Fatalf("checks %d, last with the grant's token %v", len(seen), len(seen) > 0 && seen[len(seen)-1] == g.Token)
	}
}

// A token the API server never authenticates within the wait still goes
// out, with a warning that names its ID and never its secret.
func TestMintGivesUpWaitingWithAWarning(t *testing.T) {
	fc := newFakeCluster(t, "https://10.0.0.1:6443", 1, signOnCreate)
	var logs logtest.Buffer
	k := newTestKube(t, fc, func(c *KubeConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.UsableWait = 50 * time.Millisecond
		c.Authenticates = func(context.Context, string) (bool, error) { return false, nil }
	})
	g, err := k.Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatalf("a token not yet authenticated failed the mint: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "does not authenticate the new token yet") || !strings.Contains(out, "token_id="+g.ID) {
		t.Fatalf("log %q", out)
	}
	if secret := strings.TrimPrefix(g.Token, g.ID+"."); strings.Contains(out, secret) {
		t.Fatal("the token secret was logged")
	}
}

// NewAuthenticates sends the token, and only the token, to /version:
// 200 is yes, and so is 403 (the token authenticated, the user may not
// read /version), 401 not yet, anything else an error.
func TestNewAuthenticates(t *testing.T) {
	status := http.StatusUnauthorized
	var auth, path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth, path = r.Header.Get("Authorization"), r.URL.Path
		w.WriteHeader(status)
	}))
	defer srv.Close()
	check, err := NewAuthenticates(&rest.Config{Host: srv.URL, BearerToken: "the-verifier's-own", Username: "u", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if ok, err := check(ctx, "abcdef.0123456789abcdef"); ok || err != nil {
		t.Fatalf("401: %v, %v", ok, err)
	}
	if auth != "Bearer abcdef.0123456789abcdef" || path != "/version" {
		t.Fatalf("sent %q to %q: want only the new token, to /version", auth, path)
	}
	status = http.StatusOK
	if ok, err := check(ctx, "abcdef.0123456789abcdef"); !ok || err != nil {
		t.Fatalf("200: %v, %v", ok, err)
	}
	status = http.StatusForbidden
	if ok, err := check(ctx, "abcdef.0123456789abcdef"); !ok || err != nil {
		t.Fatalf("403: %v, %v", ok, err)
	}
	status = http.StatusInternalServerError
	if ok, err := check(ctx, "abcdef.0123456789abcdef"); ok || err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("500: %v, %v", ok, err)
	}
}
