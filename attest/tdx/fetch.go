package tdx

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"time"

	"github.com/google/go-tdx-guest/pcs"
	"github.com/google/go-tdx-guest/verify/trust"

	"github.com/latchkey/latchkey/internal/atomicfile"
)

// intelRootCRLURL is where Intel publishes the SGX root CA's CRL (also the
// root certificate's CRL distribution point).
const intelRootCRLURL = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"

var fmspcRE = regexp.MustCompile(`^[0-9a-f]{12}$`)

// FetchCollateral downloads, through getter, what the validator needs for
// quotes of platforms of family fmspc (12 lower-case hex digits, from a
// quote's PCK certificate or a COLLATERAL_MISSING refusal) whose PCK
// certificates are issued by ca ("platform" or "processor"): the TDX TCB
// info, the TD QE identity, the PCK CA's CRL and the root CA's CRL. Each
// is checked as the validator checks it (signature, signing chain to
// p's trusted roots, dates at now) before it is written under dir in the
// layout CollateralConfig.Dir documents, so the cache never holds an item
// the validator would refuse as forged.
//
// getter is usually a *PCSGetter (the network); tests pass go-tdx-guest's
// testing.Getter.
func FetchCollateral(ctx context.Context, getter trust.HTTPSGetter, p Policy, fmspc, ca, dir string, now time.Time) error {
	if !fmspcRE.MatchString(fmspc) {
		return fmt.Errorf("fmspc %q is not 12 lower-case hex digits", fmspc)
	}
	if ca != "platform" && ca != "processor" {
		return fmt.Errorf("ca %q is neither platform nor processor", ca)
	}
	c, err := compile(p)
	if err != nil {
		return fmt.Errorf("tdx policy: %w", err)
	}
	files := map[string][]byte{}
	if err := fetchSigned(ctx, getter, pcs.TcbInfoURL(fmspc), pcs.TcbInfoIssuerChainPhrase, "tcbInfo", TCBInfoFileName(fmspc), c.roots, now, files); err != nil {
		return err
	}
	if err := fetchSigned(ctx, getter, pcs.QeIdentityURL(), pcs.SgxQeIdentityIssuerChainPhrase, "enclaveIdentity", qeIdentityFile, c.roots, now, files); err != nil {
		return err
	}
	if err := fetchPCKCRL(ctx, getter, ca, c.roots, now, files); err != nil {
		return err
	}
	if err := fetchRootCRL(ctx, getter, c.rootCerts, now, files); err != nil {
		return err
	}
	for name, data := range files {
		if err := atomicfile.Write(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func get(ctx context.Context, getter trust.HTTPSGetter, u string) (map[string][]string, []byte, error) {
	h, body, err := trust.GetWith(ctx, getter, u)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch %s: %w", u, err)
	}
	if len(body) == 0 || len(body) > maxCollateralSize {
		return nil, nil, fmt.Errorf("fetch %s: %d bytes (want 1 to %d)", u, len(body), maxCollateralSize)
	}
	return h, body, nil
}

// issuerChain returns the URL-encoded PEM chain of a PCS response header.
func issuerChain(h map[string][]string, key string) ([]byte, error) {
	v := h[key]
	if len(v) != 1 {
		return nil, fmt.Errorf("response header %s: want one value, got %d", key, len(v))
	}
	s, err := url.QueryUnescape(v[0])
	if err != nil {
		return nil, fmt.Errorf("response header %s: %w", key, err)
	}
	return []byte(s), nil
}

func fetchSigned(ctx context.Context, getter trust.HTTPSGetter, u, header, field, name string, roots *x509.CertPool, now time.Time, files map[string][]byte) error {
	h, body, err := get(ctx, getter, u)
	if err != nil {
		return err
	}
	chain, err := issuerChain(h, header)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", u, err)
	}
	if _, _, err := verifySigned(body, chain, field, roots, now); err != nil {
		return fmt.Errorf("fetched %s: %w", name, err)
	}
	files[name], files[name+issuerSuffix] = body, chain
	return nil
}

func fetchPCKCRL(ctx context.Context, getter trust.HTTPSGetter, ca string, roots *x509.CertPool, now time.Time, files map[string][]byte) error {
	u := pcs.PckCrlURL(ca)
	h, body, err := get(ctx, getter, u)
	if err != nil {
		return err
	}
	chain, err := issuerChain(h, pcs.SgxPckCrlIssuerChainPhrase)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", u, err)
	}
	signer, err := parseSigner(chain)
	if err != nil {
		return fmt.Errorf("fetch %s: issuer chain: %w", u, err)
	}
	if _, err := signer.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("fetched PCK CRL issuer: %w", err)
	}
	if err := checkCRL(body, signer, now); err != nil {
		return fmt.Errorf("fetched PCK CRL: %w", err)
	}
	files[PCKCRLFileName(ca)] = body
	return nil
}

func fetchRootCRL(ctx context.Context, getter trust.HTTPSGetter, roots []*x509.Certificate, now time.Time, files map[string][]byte) error {
	var errs []error
	for _, root := range roots {
		urls := root.CRLDistributionPoints
		if len(urls) == 0 {
			urls = []string{intelRootCRLURL}
		}
		for _, u := range urls {
			_, body, err := get(ctx, getter, u)
			if err == nil {
				err = checkCRL(body, root, now)
			}
			if err == nil {
				files[rootCRLFile] = body
				return nil
			}
			errs = append(errs, err)
		}
	}
	return fmt.Errorf("root CA CRL: %w", errors.Join(errs...))
}

func checkCRL(der []byte, issuer *x509.Certificate, now time.Time) error {
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return err
	}
	if err := crl.CheckSignatureFrom(issuer); err != nil {
		return err
	}
	return window("CRL", crl.ThisUpdate, crl.NextUpdate, now)
}

// PCSGetter fetches from Intel's PCS over HTTPS with a timeout and a size
// limit on every body. It implements go-tdx-guest's trust.HTTPSGetter and
// trust.ContextHTTPSGetter. Only the collateral fetch command uses it; the
// join path never does.
type PCSGetter struct {
	// Client sends the requests (default: a client with a 30 s timeout).
	Client *http.Client
}

var (
	_ trust.HTTPSGetter        = (*PCSGetter)(nil)
	_ trust.ContextHTTPSGetter = (*PCSGetter)(nil)
)

// Get fetches u with a background context.
func (g *PCSGetter) Get(u string) (map[string][]string, []byte, error) {
	return g.GetContext(context.Background(), u)
}

// GetContext fetches u; a status other than 200 is an error.
func (g *PCSGetter) GetContext(ctx context.Context, u string) (map[string][]string, []byte, error) {
	client := g.Client
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCollateralSize+1))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("%s: status %s", u, resp.Status)
	}
	if len(body) > maxCollateralSize {
		return nil, nil, fmt.Errorf("%s: body over %d bytes", u, maxCollateralSize)
	}
	return resp.Header, body, nil
}
