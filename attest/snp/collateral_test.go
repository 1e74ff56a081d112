package snp_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	test "github.com/google/go-sev-guest/testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func fakeKDS(t *testing.T, s *snptest.Signer) *test.FakeKDS {
	t.Helper()
	k, err := test.FakeKDSFromSigner(s.AMD)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newCollateral(t *testing.T, cfg snp.CollateralConfig) *snp.Collateral {
	t.Helper()
	c, err := snp.NewCollateral(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFetchCollateralFillsDirForTheValidator(t *testing.T) {
	s := snptest.New(t)
	dir := t.TempDir()
	ctx := context.Background()
	der, err := snp.FetchCollateral(ctx, fakeKDS(t, s), "Milan", s.ChipID(), s.TCB(), dir)
	if err != nil {
		t.Fatalf("FetchCollateral: %v", err)
	}
	if !bytes.Equal(der, s.VCEK()) {
		t.Error("FetchCollateral returned another certificate than the chip's VCEK")
	}
	for _, f := range []string{"ark.pem", "ask.pem", snp.VCEKFileName(s.ChipID(), s.TCB())} {
		if _, err := os.Stat(filepath.Join(dir, "Milan", f)); err != nil {
			t.Errorf("collateral dir lacks %s: %v", f, err)
		}
	}

	v := newValidator(t, s.Policy(), newCollateral(t, snp.CollateralConfig{Dir: dir}))
	binding := newBinding(t)
	if _, err := attest.Validate(ctx, v, s.EvidenceWithoutTable(binding), binding, nil); err != nil {
		t.Fatalf("Validate without certificate table: %v", err)
	}
	// A version 2 report does not name its product line; every product
	// directory is searched and the VCEK names the product.
	v2 := func(r *spb.Report) { r.Version, r.Cpuid1EaxFms = 2, 0 }
	got, err := attest.Validate(ctx, v, s.EvidenceWithoutTable(binding, v2), binding, nil)
	if err != nil {
		t.Fatalf("Validate version 2 report: %v", err)
	}
	if st := got.State.(*snp.State); st.ReportVersion != 2 || st.ProductLine != "Milan" {
		t.Errorf("State = %+v", st)
	}
}

func TestCollateralMissingNamesChipAndTCB(t *testing.T) {
	s := snptest.New(t)
	v := newValidator(t, s.Policy(), newCollateral(t, snp.CollateralConfig{Dir: t.TempDir()}))
	binding := newBinding(t)
	_, err := attest.Validate(context.Background(), v, s.EvidenceWithoutTable(binding), binding, nil)
	if attest.ReasonOf(err) != latchkeyv1.Reason_COLLATERAL_MISSING {
		t.Fatalf("Validate = %v, want COLLATERAL_MISSING", err)
	}
	for _, want := range []string{fmt.Sprintf("%x", s.ChipID()), fmt.Sprintf("%#016x", s.TCB()), "Milan"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %s", err, want)
		}
	}
}

func TestCollateralMissingForVLEKAndMaskedChip(t *testing.T) {
	coll := newCollateral(t, snp.CollateralConfig{Dir: t.TempDir()})
	binding := newBinding(t)
	vlek := snptest.NewWithOptions(t, snptest.Options{VLEK: true})
	masked := snptest.NewWithOptions(t, snptest.Options{ChipID: make([]byte, 64)})
	for name, s := range map[string]*snptest.Signer{"vlek": vlek, "masked chip": masked} {
		v := newValidator(t, s.Policy(), coll)
		_, err := attest.Validate(context.Background(), v, s.EvidenceWithoutTable(binding), binding, nil)
		if attest.ReasonOf(err) != latchkeyv1.Reason_COLLATERAL_MISSING {
			t.Errorf("%s: Validate = %v, want COLLATERAL_MISSING", name, err)
		}
	}
}

func TestFetchCollateralRefusesWrongCertificate(t *testing.T) {
	s := snptest.New(t)
	other := snptest.NewWithOptions(t, snptest.Options{ChipID: bytes.Repeat([]byte{9}, 64)})
	url := kds.VCEKCertURL("Milan", s.ChipID(), kds.TCBVersion(s.TCB()))
	getter := test.SimpleGetter(map[string][]byte{url: other.VCEK()})
	_, err := snp.FetchCollateral(context.Background(), getter, "Milan", s.ChipID(), s.TCB(), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "certificate is for chip") {
		t.Errorf("FetchCollateral with another chip's VCEK = %v", err)
	}
	_, err = snp.FetchCollateral(context.Background(), fakeKDS(t, s), "Milan", s.ChipID(), s.TCB()+1, "")
	if err == nil {
		t.Error("FetchCollateral of a TCB KDS does not have succeeded")
	}
	if _, err := snp.FetchCollateral(context.Background(), fakeKDS(t, s), "Naples", s.ChipID(), s.TCB(), ""); err == nil {
		t.Error("FetchCollateral accepted an unknown product line")
	}
}

// roundTrip is an http.RoundTripper from a function: the KDSGetter tests
// never open a socket.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func response(code int, body string, header http.Header) *http.Response {
	if header == nil {
		header = http.Header{}
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: header, Body: io.NopCloser(strings.NewReader(body))}
}

type kdsScript struct {
	responses []*http.Response
	requests  int
	sleeps    []time.Duration
}

func (k *kdsScript) getter() *snp.KDSGetter {
	return &snp.KDSGetter{
		Client: &http.Client{Transport: roundTrip(func(*http.Request) (*http.Response, error) {
			r := k.responses[min(k.requests, len(k.responses)-1)]
			k.requests++
			return r, nil
		})},
		Backoff: time.Second, MaxBackoff: time.Minute, MaxAttempts: 4,
		Sleep: func(_ context.Context, d time.Duration) error { k.sleeps = append(k.sleeps, d); return nil },
	}
}

func TestKDSGetterHonoursRateLimits(t *testing.T) {
	tests := []struct {
		name       string
		responses  []*http.Response
		wantBody   string
		wantErr    bool
		wantSleeps []time.Duration
	}{
		{
			name:       "429 with Retry-After",
			responses:  []*http.Response{response(429, "", http.Header{"Retry-After": {"7"}}), response(200, "cert", nil)},
			wantBody:   "cert",
			wantSleeps: []time.Duration{7 * time.Second},
		},
		{
			name:       "5xx backs off exponentially",
			responses:  []*http.Response{response(503, "", nil), response(502, "", nil), response(200, "cert", nil)},
			wantBody:   "cert",
			wantSleeps: []time.Duration{time.Second, 2 * time.Second},
		},
		{
			name:       "Retry-After capped at MaxBackoff",
			responses:  []*http.Response{response(429, "", http.Header{"Retry-After": {"3600"}}), response(200, "cert", nil)},
			wantBody:   "cert",
			wantSleeps: []time.Duration{time.Minute},
		},
		{
			name:      "404 fails at once",
			responses: []*http.Response{response(404, "", nil)},
			wantErr:   true,
		},
		{
			name:       "gives up after MaxAttempts",
			responses:  []*http.Response{response(429, "", nil)},
			wantErr:    true,
			wantSleeps: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second},
		},
		{
			name:      "oversized body",
			responses: []*http.Response{response(200, strings.Repeat("x", 64<<10), nil)},
			wantErr:   true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := &kdsScript{responses: tc.responses}
			body, err := k.getter().Get("https://kdsintf.amd.com/vcek/v1/Milan/cert_chain")
			if (err != nil) != tc.wantErr || string(body) != tc.wantBody {
				t.Fatalf("Get = %q, %v", body, err)
			}
			if fmt.Sprint(k.sleeps) != fmt.Sprint(tc.wantSleeps) {
				t.Errorf("sleeps = %v, want %v", k.sleeps, tc.wantSleeps)
			}
		})
	}
}

// TestFetchCollateralThroughKDSGetter runs the whole fetch over HTTP
// semantics (a 429 first) against the fake KDS, without a socket.
func TestFetchCollateralThroughKDSGetter(t *testing.T) {
	s := snptest.New(t)
	kdsFake := fakeKDS(t, s)
	throttled := false
	var sleeps []time.Duration
	g := &snp.KDSGetter{
		Client: &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
			if !throttled {
				throttled = true
				return response(429, "", http.Header{"Retry-After": {"10"}}), nil
			}
			body, err := kdsFake.Get(r.URL.String())
			if err != nil {
				return response(404, err.Error(), nil), nil
			}
			return response(200, string(body), nil), nil
		})},
		Sleep: func(_ context.Context, d time.Duration) error { sleeps = append(sleeps, d); return nil },
	}
	dir := t.TempDir()
	if _, err := snp.FetchCollateral(context.Background(), g, "Milan", s.ChipID(), s.TCB(), dir); err != nil {
		t.Fatalf("FetchCollateral: %v", err)
	}
	if fmt.Sprint(sleeps) != "[10s]" {
		t.Errorf("sleeps = %v, want [10s]", sleeps)
	}
	ark, err := os.ReadFile(filepath.Join(dir, "Milan", "ark.pem"))
	if err != nil || !strings.Contains(string(ark), "BEGIN CERTIFICATE") {
		t.Errorf("ark.pem = %q, %v", ark, err)
	}
}
