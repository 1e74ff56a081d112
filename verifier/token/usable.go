package token

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"k8s.io/client-go/rest"

	"github.com/latchkey/latchkey/internal/logkey"
)

// DefaultUsableWait bounds Mint's wait for the API server to authenticate
// a new token (KubeConfig.Authenticates).
const DefaultUsableWait = 5 * time.Second

// maxVersionBody bounds what is read of the API server's /version.
const maxVersionBody = 64 << 10

// NewAuthenticates returns a KubeConfig.Authenticates that asks the API
// server of rc for /version with the token as its only credential: 200
// (or 403, where /version is not open to every user) says the server
// authenticates it, 401 that it does not yet. The
// server's address and trust come from rc, its credentials do not; one
// HTTP client (and its connections) serves every check.
func NewAuthenticates(rc *rest.Config) (func(ctx context.Context, token string) (bool, error), error) {
	anon := rest.AnonymousClientConfig(rc)
	hc, err := rest.HTTPClientFor(anon)
	if err != nil {
		return nil, fmt.Errorf("token: client for the usability check: %w", err)
	}
	u, err := url.JoinPath(anon.Host, "version")
	if err != nil {
		return nil, fmt.Errorf("token: API server address %q: %w", anon.Host, err)
	}
	return func(ctx context.Context, token string) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return false, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxVersionBody))
		switch resp.StatusCode {
		case http.StatusOK, http.StatusForbidden: // authorization comes after authentication
			return true, nil
		case http.StatusUnauthorized:
			return false, nil
		}
		return false, fmt.Errorf("GET /version with the new token: %s", resp.Status)
	}, nil
}

// waitUsable waits until the API server authenticates g's token, up to
// UsableWait. The token Secret reaches the API server's authenticator
// through its informer, a moment after the write returned; kubeadm
// retries its first read with the token for only 350 ms, and in a boot
// storm the gap can be longer. Past the wait (or when ctx ends) the ticket
// goes out anyway, with a warning: kubeadm and the agent retry.
func (k *Kube) waitUsable(ctx context.Context, g *Grant) {
	if k.cfg.Authenticates == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, k.cfg.UsableWait)
	defer cancel()
	var last error
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		ok, err := k.cfg.Authenticates(wctx, g.Token)
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		select {
		case <-wctx.Done():
			args := []any{logkey.TokenID, g.ID, logkey.Waited, k.cfg.UsableWait.String()}
			if last != nil {
				args = append(args, logkey.Error, last.Error())
			}
			k.log.Warn("the API server does not authenticate the new token yet; the ticket goes out anyway", args...)
			return
		case <-time.After(pause):
		}
	}
}
