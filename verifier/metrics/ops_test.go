package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/version"
)

func TestBuildInfoNamesTheRunningBuild(t *testing.T) {
	b := version.Get()
	series := fmt.Sprintf(`latchkey_verifier_build_info{goversion=%q,revision=%q,version=%q}`, b.GoVersion, b.Revision, b.Version)
	expect(t, scrape(t, New()), map[string]string{series: "1"})
}

func TestServingCertificateExpiry(t *testing.T) {
	m := New()
	notAfter := time.Date(2031, 5, 4, 3, 2, 1, 0, time.UTC)
	m.ServingCertificateExpires(notAfter)
	expect(t, scrape(t, m), map[string]string{
		`latchkey_verifier_serving_certificate_expiry_timestamp_seconds`: strconv.FormatFloat(float64(notAfter.Unix()), 'g', -1, 64),
	})
}

// TestReloadTimestampMovesOnlyOnSuccess: a failed reload leaves the time
// of the last good one, which is what "reload failing for 10m" alerts on.
func TestReloadTimestampMovesOnlyOnSuccess(t *testing.T) {
	m := New()
	now := time.Unix(1_800_000_000, 500_000_000)
	m.ops.nowForTests = func() time.Time { return now }
	m.PolicyLoaded("sha256:aa")
	now = now.Add(time.Hour)
	m.PolicyReloadFailed()
	expect(t, scrape(t, m), map[string]string{
		`latchkey_verifier_policy_last_reload_success_timestamp_seconds`: "1.8000000005e+09",
		`latchkey_verifier_policy_reloads_total{result="error"}`:         "1",
		`latchkey_verifier_policy_reload_failing`:                        "1",
	})
	m.PolicyLoaded("sha256:bb")
	expect(t, scrape(t, m), map[string]string{
		`latchkey_verifier_policy_last_reload_success_timestamp_seconds`: "1.8000036005e+09",
		`latchkey_verifier_policy_reload_failing`:                        "0",
	})
}

func TestHandshakeFailuresByCause(t *testing.T) {
	m := New()
	m.HandshakeFailed(HandshakeClientAlert)
	m.HandshakeFailed(HandshakeClientAlert)
	m.HandshakeFailed(HandshakeTimeout)
	m.HandshakeFailed("made-up") // no caller mints a label
	want := map[string]string{
		`latchkey_verifier_tls_handshake_failures_total{cause="client_alert"}`:     "2",
		`latchkey_verifier_tls_handshake_failures_total{cause="timeout"}`:          "1",
		`latchkey_verifier_tls_handshake_failures_total{cause="server_refused"}`:   "1",
		`latchkey_verifier_tls_handshake_failures_total{cause="not_tls"}`:          "0",
		`latchkey_verifier_tls_handshake_failures_total{cause="client_closed"}`:    "0",
		`latchkey_verifier_tls_handshake_failures_total{cause="incomplete_hello"}`: "0",
	}
	got := scrape(t, m)
	expect(t, got, want)
	if _, ok := got[`latchkey_verifier_tls_handshake_failures_total{cause="made-up"}`]; ok {
		t.Error("a caller minted a cause label")
	}
}

// get serves m and returns the status and body of one GET path.
func get(t *testing.T, m *Metrics, path string) (int, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- m.Serve(ctx, l, nil) }()
	defer func() { cancel(); <-served }()
	resp, err := http.Get("http://" + l.Addr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestHealthzAndReadyz(t *testing.T) {
	m := New()
	if code, body := get(t, m, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, m, "/readyz"); code != http.StatusServiceUnavailable || body != "not ready: starting\n" {
		t.Errorf("/readyz before a check is set: %d %q", code, body)
	}
	var fail error = errors.New("binding store: connection refused")
	m.SetReadyCheck(func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("check called without a deadline")
		}
		return fail
	})
	if code, body := get(t, m, "/readyz"); code != http.StatusServiceUnavailable || body != "not ready: binding store: connection refused\n" {
		t.Errorf("/readyz with the store down: %d %q", code, body)
	}
	fail = nil
	if code, body := get(t, m, "/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz once ready: %d %q", code, body)
	}
	// /healthz does not depend on readiness.
	fail = errors.New("policy not loaded")
	if code, _ := get(t, m, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while not ready: %d", code)
	}
}
