package snp

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/latchkey/latchkey/internal/atomicfile"
	"github.com/latchkey/latchkey/internal/clock"
	"github.com/latchkey/latchkey/internal/logkey"
)

// FetchCollateral downloads, through getter, the VCEK of chipID at tcb
// (a report's CHIP_ID and REPORTED_TCB) from AMD KDS at the URL
// go-sev-guest's kds package builds, checks that the certificate is that
// chip's at that TCB, and writes it under dir in the layout
// CollateralConfig.Dir documents, with the product's ask.pem and ark.pem
// when dir does not hold them yet. dir "" only downloads and checks.
//
// getter is usually a *KDSGetter, which backs off when KDS rate-limits;
// tests pass a fake (go-sev-guest's testing.FakeKDS fits). nil means a
// default KDSGetter, i.e. the network.
func FetchCollateral(ctx context.Context, getter trust.HTTPSGetter, productLine string, chipID []byte, tcb uint64, dir string) ([]byte, error) {
	if !slices.Contains(productLines, productLine) {
		return nil, fmt.Errorf("product line %q is not one of %v", productLine, productLines)
	}
	if len(chipID) != abi.ChipIDSize || allZero(chipID) {
		return nil, fmt.Errorf("chip ID must be %d non-zero bytes", abi.ChipIDSize)
	}
	if getter == nil {
		getter = &KDSGetter{}
	}
	url := kds.VCEKCertURL(productLine, chipID, kds.TCBVersion(tcb))
	der, err := trust.GetWith(ctx, getter, url)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", url, err)
	}
	if err := checkFetchedVCEK(der, chipID, tcb); err != nil {
		return nil, fmt.Errorf("fetched VCEK: %w", err)
	}
	if dir == "" {
		return der, nil
	}
	if err := storeCollateral(ctx, getter, dir, productLine, chipID, tcb, der); err != nil {
		return nil, err
	}
	return der, nil
}

// Fetch runs FetchCollateral into the cache's Dir and Adds the result, so
// the Store (when configured) shares it with every replica.
func (c *Collateral) Fetch(ctx context.Context, getter trust.HTTPSGetter, productLine string, chipID []byte, tcb uint64) ([]byte, error) {
	der, err := FetchCollateral(ctx, getter, productLine, chipID, tcb, c.dir)
	if err != nil {
		return nil, err
	}
	return der, c.Add(ctx, chipID, tcb, der)
}

func checkFetchedVCEK(der, chipID []byte, tcb uint64) error {
	if len(der) == 0 || len(der) > maxCertSize {
		return fmt.Errorf("%d bytes is not a certificate", len(der))
	}
	cert, err := trust.ParseCert(der)
	if err != nil {
		return err
	}
	exts, err := kds.VcekCertificateExtensions(cert)
	if err != nil {
		return err
	}
	if !bytes.Equal(exts.HWID, chipID) {
		return fmt.Errorf("certificate is for chip %s", hex.EncodeToString(exts.HWID))
	}
	if uint64(exts.TCBVersion) != tcb {
		return fmt.Errorf("certificate is for TCB %#016x, want %#016x", uint64(exts.TCBVersion), tcb)
	}
	return nil
}

func storeCollateral(ctx context.Context, getter trust.HTTPSGetter, dir, line string, chipID []byte, tcb uint64, der []byte) error {
	pdir := filepath.Join(dir, line)
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return fmt.Errorf("collateral dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(pdir, "ark.pem")); errors.Is(err, os.ErrNotExist) {
		if err := fetchProductChain(ctx, getter, pdir, line, der); err != nil {
			return err
		}
	}
	return atomicfile.Write(filepath.Join(pdir, VCEKFileName(chipID, tcb)), der, 0o644)
}

// fetchProductChain stores the product's ASK and ARK next to the VCEKs
// for operators to inspect or pin; it checks that they sign the VCEK.
func fetchProductChain(ctx context.Context, getter trust.HTTPSGetter, pdir, line string, vcekDER []byte) error {
	url := kds.ProductCertChainURL(abi.VcekReportSigner, line)
	bundle, err := trust.GetWith(ctx, getter, url)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	ask, ark, err := kds.ParseProductCertChain(bundle)
	if err != nil {
		return fmt.Errorf("parse %s cert chain: %w", line, err)
	}
	var pc trust.ProductCerts
	if err := pc.Decode(ask, ark); err != nil || pc.Ask == nil || pc.Ark == nil {
		return fmt.Errorf("decode %s cert chain: %v", line, err)
	}
	vcek, err := trust.ParseCert(vcekDER)
	if err != nil {
		return err
	}
	if err := vcek.CheckSignatureFrom(pc.Ask); err != nil {
		return fmt.Errorf("fetched VCEK is not signed by the fetched %s ASK: %w", line, err)
	}
	if err := atomicfile.Write(filepath.Join(pdir, "ask.pem"), pemCert(ask), 0o644); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(pdir, "ark.pem"), pemCert(ark), 0o644)
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// KDSGetter fetches from AMD KDS over HTTPS and honours its rate limits: a
// 429 (or 5xx, or a transport error) is retried after the Retry-After the
// server names, else after a backoff that starts at Backoff (AMD throttles
// repeats to about one per 10 s) and doubles up to MaxBackoff. Any other
// status fails at once. It implements go-sev-guest's trust.HTTPSGetter and
// trust.ContextHTTPSGetter. Only the collateral fetch command uses it; the
// join path never does.
type KDSGetter struct {
	// Client sends the requests (default: a client with a 30 s timeout).
	Client *http.Client
	// MaxAttempts bounds the attempts per URL (default 6).
	MaxAttempts int
	// Backoff is the first wait (default 10 s); MaxBackoff caps every wait
	// (default 2 min).
	Backoff, MaxBackoff time.Duration
	// Sleep waits d or until ctx ends (default: a timer); tests record.
	Sleep func(ctx context.Context, d time.Duration) error
	// Logger notes each retry (default slog.Default()).
	Logger *slog.Logger
}

var (
	_ trust.HTTPSGetter        = (*KDSGetter)(nil)
	_ trust.ContextHTTPSGetter = (*KDSGetter)(nil)
)

// Get fetches url with a background context.
func (g *KDSGetter) Get(url string) ([]byte, error) {
	return g.GetContext(context.Background(), url)
}

// GetContext fetches url, retrying as the type's doc says.
func (g *KDSGetter) GetContext(ctx context.Context, url string) ([]byte, error) {
	attempts := cmpOr(g.MaxAttempts, 6)
	wait := cmpOr(g.Backoff, 10*time.Second)
	maxWait := cmpOr(g.MaxBackoff, 2*time.Minute)
	var lastErr error
	for attempt := 1; ; attempt++ {
		body, retryAfter, err := g.once(ctx, url)
		if err == nil {
			return body, nil
		}
		var perm permanentError
		if errors.As(err, &perm) || attempt >= attempts {
			return nil, err
		}
		lastErr = err
		d := wait
		if retryAfter > 0 {
			d = retryAfter
		}
		d = min(d, maxWait)
		g.logger().Info("kds: retrying", logkey.URL, url, logkey.Attempt, attempt, logkey.RetryIn, d, logkey.Error, err)
		if err := g.sleep(ctx, d); err != nil {
			return nil, errors.Join(lastErr, err)
		}
		wait = min(2*wait, maxWait)
	}
}

type permanentError struct{ error }

// once sends one request; a retryable failure reports the server's
// Retry-After (0 when absent).
func (g *KDSGetter) once(ctx context.Context, url string) ([]byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, permanentError{err}
	}
	client := g.Client
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, permanentError{err}
		}
		return nil, 0, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		return readBody(resp.Body)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return nil, retryAfter(resp.Header.Get("Retry-After"), time.Now()), fmt.Errorf("kds: %s", resp.Status)
	default:
		return nil, 0, permanentError{fmt.Errorf("kds: %s for %s", resp.Status, url)}
	}
}

func readBody(r io.Reader) ([]byte, time.Duration, error) {
	body, err := io.ReadAll(io.LimitReader(r, maxCertSize+1))
	if err != nil {
		return nil, 0, err
	}
	if len(body) > maxCertSize {
		return nil, 0, permanentError{fmt.Errorf("kds: response exceeds %d bytes", maxCertSize)}
	}
	return body, 0, nil
}

// retryAfter parses a Retry-After header (seconds or an HTTP date).
func retryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if s, err := strconv.Atoi(h); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func (g *KDSGetter) sleep(ctx context.Context, d time.Duration) error {
	if g.Sleep != nil {
		return g.Sleep(ctx, d)
	}
	return clock.Sleep(ctx, d)
}

func (g *KDSGetter) logger() *slog.Logger {
	if g.Logger != nil {
		return g.Logger
	}
	return slog.Default()
}

func cmpOr[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
