package metrics

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// scrape serves m on a loopback port and returns the samples of one GET
// /metrics, keyed by "name{labels}".
func scrape(t *testing.T, m *Metrics) map[string]string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- m.Serve(ctx, l, nil) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	samples := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		samples[line[:i]] = line[i+1:]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return samples
}

func expect(t *testing.T, samples map[string]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := samples[k]; !ok || got != v {
			t.Errorf("%s = %q (present %v), want %q", k, got, ok, v)
		}
	}
}

func TestScrapeAfterJoinAndRefusal(t *testing.T) {
	m := New()
	before := scrape(t, m)
	expect(t, before, map[string]string{
		`latchkey_verifier_joins_total{reason="none",result="accepted",variant="tpm"}`: "0",
		`latchkey_verifier_tokens_minted_total`:                                        "0",
	})

	tpm := latchkeyv1.Variant_VARIANT_TPM
	m.ObserveValidation(tpm, 150*time.Microsecond)
	m.Join(tpm, nil)
	m.TokenMinted()
	m.ObserveValidation(tpm, 300*time.Microsecond)
	m.Join(tpm, attest.Refuse(latchkeyv1.Reason_PCR_MISMATCH, "pcr %d holds an unlisted value", 7))
	m.Join(latchkeyv1.Variant_VARIANT_SNP, errors.New("kubernetes unreachable"))
	m.TokenRevoked(RevokeNoAck)
	m.PolicyLoaded("sha256:aaaa")
	m.PolicyReloadFailed()
	m.PolicyLoaded("sha256:bbbb")

	after := scrape(t, m)
	expect(t, after, map[string]string{
		`latchkey_verifier_joins_total{reason="none",result="accepted",variant="tpm"}`:        "1",
		`latchkey_verifier_joins_total{reason="PCR_MISMATCH",result="refused",variant="tpm"}`: "1",
		`latchkey_verifier_joins_total{reason="INTERNAL",result="failed",variant="snp"}`:      "1",
		`latchkey_verifier_validation_duration_seconds_count{variant="tpm"}`:                  "2",
		`latchkey_verifier_validation_duration_seconds_bucket{variant="tpm",le="0.00025"}`:    "1",
		`latchkey_verifier_validation_duration_seconds_bucket{variant="tpm",le="0.0005"}`:     "2",
		`latchkey_verifier_tokens_minted_total`:                                               "1",
		`latchkey_verifier_tokens_revoked_total{cause="no_ack"}`:                              "1",
		`latchkey_verifier_tokens_revoked_total{cause="admin"}`:                               "0",
		`latchkey_verifier_policy_reloads_total{result="ok"}`:                                 "2",
		`latchkey_verifier_policy_reloads_total{result="error"}`:                              "1",
		`latchkey_verifier_policy_info{digest="sha256:bbbb"}`:                                 "1",
	})
	if _, stale := after[`latchkey_verifier_policy_info{digest="sha256:aaaa"}`]; stale {
		t.Error("the replaced policy digest is still exported")
	}
	if _, ok := after["process_resident_memory_bytes"]; !ok {
		t.Error("no process_resident_memory_bytes")
	}
}

// TestPeerCannotMintLabels: a variant number no enum names becomes
// "unknown" instead of a new series per number.
func TestPeerCannotMintLabels(t *testing.T) {
	m := New()
	m.Join(latchkeyv1.Variant(31337), attest.Refuse(latchkeyv1.Reason_UNKNOWN_VARIANT, "variant 31337"))
	m.Join(latchkeyv1.Variant_VARIANT_UNSPECIFIED, attest.Refuse(latchkeyv1.Reason_UNKNOWN_VARIANT, "no variant"))
	m.TokenRevoked("whatever")
	expect(t, scrape(t, m), map[string]string{
		`latchkey_verifier_joins_total{reason="UNKNOWN_VARIANT",result="refused",variant="unknown"}`: "2",
		`latchkey_verifier_tokens_revoked_total{cause="other"}`:                                      "1",
	})
}

func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	m.Join(latchkeyv1.Variant_VARIANT_TPM, nil)
	m.ObserveValidation(latchkeyv1.Variant_VARIANT_TPM, time.Millisecond)
	m.TokenMinted()
	m.TokenRevoked(RevokeAdmin)
	m.PolicyLoaded("sha256:aa")
	m.PolicyReloadFailed()
}

func TestOffByDefault(t *testing.T) {
	done := make(chan error, 1)
	go func() { done <- New().ListenAndServe(context.Background(), "", nil) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ListenAndServe with no address kept running")
	}
}

func TestOnlyMetricsPathIsServed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go New().Serve(ctx, l, nil)
	resp, err := http.Get("http://" + l.Addr().String() + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /debug/pprof/: %s, want 404", resp.Status)
	}
}
