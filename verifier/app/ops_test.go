package app_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
)

// sample returns the value of one series in a /metrics body ("" when
// absent).
func sample(body, series string) string {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// waitSample scrapes until series has value want.
func waitSample(t *testing.T, addr, series, want string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := scrape(t, addr)
		if sample(m, series) == want {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %q, want %q\n%s", series, sample(m, series), want, m)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestProbesAndOpsMetricsOfALiveVerifier: the assembled verifier answers
// /healthz and /readyz, names its build, exports its serving
// certificate's expiry as served to agents and when the policy loaded.
func TestProbesAndOpsMetricsOfALiveVerifier(t *testing.T) {
	addr := freeAddr(t)
	before := time.Now()
	r := newRig(t, rigOpts{metricsListen: addr})
	m := scrape(t, addr)
	if code, body := httpGet(t, "http://"+addr+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := httpGet(t, "http://"+addr+"/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if !strings.Contains(m, "latchkey_verifier_build_info{goversion=\"go") {
		t.Errorf("no build_info:\n%s", m)
	}
	conn, err := tls.Dial("tcp", r.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	notAfter := conn.ConnectionState().PeerCertificates[0].NotAfter
	conn.Close()
	if got, want := sample(m, "latchkey_verifier_serving_certificate_expiry_timestamp_seconds"), fmt.Sprint(float64(notAfter.Unix())); got != want {
		// Prometheus' text format writes large floats in e-notation.
		if got != fmt.Sprintf("%g", float64(notAfter.Unix())) {
			t.Errorf("serving certificate expiry %s, want %s (%s)", got, want, notAfter)
		}
	}
	var loaded float64
	if _, err := fmt.Sscan(sample(m, "latchkey_verifier_policy_last_reload_success_timestamp_seconds"), &loaded); err != nil ||
		loaded < float64(before.Unix()) || loaded > float64(time.Now().Unix()+1) {
		t.Errorf("policy_last_reload_success_timestamp_seconds %v (%v), want the start of this test", loaded, err)
	}
}

// TestStalePinShowsAsClientAlert: an agent pinned to a certificate the
// verifier no longer serves (a rotation gone wrong) is counted and
// logged by the verifier, while a good handshake is not.
func TestStalePinShowsAsClientAlert(t *testing.T) {
	addr := freeAddr(t)
	r := newRig(t, rigOpts{metricsListen: addr})
	good, err := tls.Dial("tcp", r.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	good.Close()
	stale := atls.PinOf(pkitest.SelfSigned(t, "rotated-away").Cert)
	agent, err := ticket.New(ticket.Config{Issuer: r.issuer(t), Timeout: time.Minute, Endpoints: []string{r.addr},
		Pins: []atls.Pin{stale}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sleep: func(context.Context, time.Duration) error { return context.Canceled }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Get(context.Background(), worker()); err == nil || !strings.Contains(err.Error(), atls.ErrPinMismatch.Error()) {
		t.Fatalf("agent with a stale pin: %v", err)
	}
	m := waitSample(t, addr, `latchkey_verifier_tls_handshake_failures_total{cause="client_alert"}`, "1")
	for _, cause := range []string{"client_closed", "server_refused", "not_tls", "incomplete_hello", "timeout"} {
		if got := sample(m, `latchkey_verifier_tls_handshake_failures_total{cause="`+cause+`"}`); got != "0" {
			t.Errorf("%s = %q after one good handshake and one stale pin", cause, got)
		}
	}
	if logs := r.logs.String(); !strings.Contains(logs, "cause=client_alert") || !strings.Contains(logs, "pin matches no certificate") {
		t.Errorf("no log line for the stale pin:\n%s", logs)
	}
}

// TestListenerInUseIsAConfigError: an address another program holds
// stops the verifier with a configuration error naming the setting,
// instead of a verifier serving without its metrics or admin API.
func TestListenerInUseIsAConfigError(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, c := range []struct {
		setting string
		set     func(cfg *app.Config, dir string)
	}{
		{"metricsListen", func(cfg *app.Config, _ string) { cfg.MetricsListen = held.Addr().String() }},
		{"listen", func(cfg *app.Config, _ string) { cfg.Listen = held.Addr().String() }},
		// A socket path whose directory is a file.
		{"adminSocket", func(cfg *app.Config, dir string) { cfg.AdminSocket = filepath.Join(dir, "master", "admin.sock") }},
	} {
		t.Run(c.setting, func(t *testing.T) {
			dir, cfg := verifierFiles(t, map[string]any{"tpm": map[string]any{"pcrs": map[string]any{}}}, randomSecret(), "bind")
			c.set(cfg, dir)
			v, err := app.New(cfg, app.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = v.Serve(ctx)
			if !errors.Is(err, app.ErrConfig) || !strings.Contains(err.Error(), c.setting+" ") {
				t.Fatalf("Serve: %v, want a configuration error naming %s", err, c.setting)
			}
		})
	}
}

// downStore is a binding store whose backend does not answer.
type downStore struct{ binding.Store }

func (downStore) Get(context.Context, binding.Kind, string) (binding.Record, error) {
	return binding.Record{}, errors.New("dial etcd: connection refused")
}

func (downStore) List(context.Context) ([]binding.Record, error) {
	return nil, errors.New("dial etcd: connection refused")
}

// TestReadyzNamesAnUnreachableStore: /readyz fails, naming the store,
// while /healthz (the process) stays up.
func TestReadyzNamesAnUnreachableStore(t *testing.T) {
	addr := freeAddr(t)
	_, cfg := verifierFiles(t, map[string]any{"tpm": map[string]any{"pcrs": map[string]any{}}}, randomSecret(), "ready")
	cfg.MetricsListen = addr
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	v, err := app.New(cfg, app.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Listener: lis, Bindings: downStore{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	scrape(t, addr) // waits until the listener serves
	if code, body := httpGet(t, "http://"+addr+"/readyz"); code != http.StatusServiceUnavailable ||
		body != "not ready: binding store unreachable: dial etcd: connection refused\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, _ := httpGet(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
}
