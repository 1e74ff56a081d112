package tdx

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/go-tdx-guest/pcs"

	"github.com/latchkey/latchkey/internal/logkey"
)

// ErrCollateralMissing says the cache holds no collateral under the name
// asked for (or only a file that is unreadable or too large).
var ErrCollateralMissing = errors.New("tdx collateral missing")

// maxCollateralSize bounds one collateral file. Intel's TDX TCB info is
// about 8 KiB, a PCK CRL a few KiB.
const maxCollateralSize = 256 << 10

// Collateral file names under CollateralConfig.Dir.
const (
	qeIdentityFile = "qeidentity.json"
	rootCRLFile    = "rootcrl.der"
	issuerSuffix   = ".issuer.pem"
)

// TCBInfoFileName is the cache file of the TCB info of a platform family
// (FMSPC, 12 hex digits, lower case); its signing chain is kept next to it
// with issuerSuffix.
func TCBInfoFileName(fmspc string) string { return "tcbinfo-" + fmspc + ".json" }

// PCKCRLFileName is the cache file of the CRL of a PCK CA ("platform" or
// "processor").
func PCKCRLFileName(ca string) string { return "pckcrl-" + ca + ".der" }

// CollateralConfig configures NewCollateral.
type CollateralConfig struct {
	// Dir is the on-disk cache the operator fills ahead of time with
	// `latchkey-verifier collateral fetch` (FetchCollateral). Layout:
	//
	//	<Dir>/tcbinfo-<FMSPC>.json            TDX TCB info, as Intel PCS serves it
	//	<Dir>/tcbinfo-<FMSPC>.json.issuer.pem its signing chain (TCB signing cert, root)
	//	<Dir>/qeidentity.json                 TD QE identity, as Intel PCS serves it
	//	<Dir>/qeidentity.json.issuer.pem      its signing chain
	//	<Dir>/pckcrl-<platform|processor>.der the PCK CA's CRL (DER)
	//	<Dir>/rootcrl.der                     the root CA's CRL (DER)
	//
	// Nothing here is trusted for what it says: every item is checked
	// against the policy's trusted roots (its signature, its signer's
	// chain and the dates) each time a quote needs it.
	Dir string
	// Logger receives cache errors (default slog.Default()).
	Logger *slog.Logger
}

// Collateral reads Intel's TDX collateral from the offline cache. It never
// touches the network. Files are re-read when their size or modification
// time changes, so a `collateral fetch` while the verifier runs takes
// effect at the next join. Safe for concurrent use.
type Collateral struct {
	dir   string
	log   *slog.Logger
	mu    sync.Mutex
	files map[string]cachedFile
	// verified caches the outcome of the signature checks of an item by
	// its content and the roots it was checked against (at most
	// maxVerified entries), so a join re-checks only dates: the signing
	// chain's validity window is kept with it.
	verified map[verifiedKey]verifiedItem
}

// maxVerified bounds Collateral.verified; a few entries per policy reload
// and collateral refresh, so clearing it when full costs one re-check.
const maxVerified = 64

type verifiedKey struct {
	name   string
	digest [sha256.Size]byte
	roots  *x509.CertPool
	// issuer is the SHA-256 of the certificate a CRL was checked against.
	issuer [sha256.Size]byte
}

type verifiedItem struct {
	value     any
	signer    *x509.Certificate
	notBefore time.Time
	notAfter  time.Time
}

func (c *Collateral) lookup(k verifiedKey) (verifiedItem, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.verified[k]
	return v, ok
}

func (c *Collateral) remember(k verifiedKey, v verifiedItem) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.verified) >= maxVerified {
		clear(c.verified)
	}
	c.verified[k] = v
}

// chainWindow is the time every certificate of chain is valid in.
func chainWindow(chain []*x509.Certificate) (notBefore, notAfter time.Time) {
	for i, cert := range chain {
		if i == 0 || cert.NotBefore.After(notBefore) {
			notBefore = cert.NotBefore
		}
		if i == 0 || cert.NotAfter.Before(notAfter) {
			notAfter = cert.NotAfter
		}
	}
	return notBefore, notAfter
}

type cachedFile struct {
	size    int64
	modTime time.Time
	data    []byte
}

// NewCollateral returns a cache over cfg.Dir, which must exist.
func NewCollateral(cfg CollateralConfig) (*Collateral, error) {
	fi, err := os.Stat(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("tdx collateral dir: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("tdx collateral dir %s is not a directory", cfg.Dir)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Collateral{dir: cfg.Dir, log: log, files: map[string]cachedFile{}, verified: map[verifiedKey]verifiedItem{}}, nil
}

// read returns the contents of name, from memory while the file is
// unchanged. Errors other than a missing file are logged; every error
// wraps ErrCollateralMissing.
func (c *Collateral) read(name string) ([]byte, error) {
	path := filepath.Join(c.dir, name)
	fi, err := os.Stat(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("tdx collateral: stat", logkey.File, name, logkey.Error, err)
		}
		return nil, fmt.Errorf("%s: %w", name, ErrCollateralMissing)
	}
	c.mu.Lock()
	cf, ok := c.files[name]
	c.mu.Unlock()
	if ok && cf.size == fi.Size() && cf.modTime.Equal(fi.ModTime()) {
		return cf.data, nil
	}
	data, err := readLimited(path)
	if err != nil {
		c.log.Warn("tdx collateral: read", logkey.File, name, logkey.Error, err)
		return nil, fmt.Errorf("%s: %w", name, ErrCollateralMissing)
	}
	c.mu.Lock()
	c.files[name] = cachedFile{size: fi.Size(), modTime: fi.ModTime(), data: data}
	c.mu.Unlock()
	return data, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCollateralSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 || len(b) > maxCollateralSize {
		return nil, fmt.Errorf("%d bytes is not collateral (1 to %d)", len(b), maxCollateralSize)
	}
	return b, nil
}

// signedItem is a TCB info or QE identity whose signature and signing
// chain verified.
type signedItem struct {
	signer *x509.Certificate
}

// collateralError is a collateral item that failed its checks: missing
// (or stale) collateral is the operator's to refresh, a bad signature or
// chain is untrusted.
type collateralError struct {
	stale bool
	err   error
}

func (e *collateralError) Error() string { return e.err.Error() }
func (e *collateralError) Unwrap() error { return e.err }

func staleErr(format string, args ...any) error {
	return &collateralError{stale: true, err: fmt.Errorf(format, args...)}
}

func untrustedErr(format string, args ...any) error {
	return &collateralError{err: fmt.Errorf(format, args...)}
}

// tcbSignerCN is the subject of the key that signs TCB info and QE
// identity.
const tcbSignerCN = "Intel SGX TCB Signing"

// verifySigned checks one signed PCS response: body is the JSON object
// {"<field>": {...}, "signature": "<hex r||s>"} and issuerPEM its signing
// certificate (and, ignored, the root); the signature must verify over the
// raw bytes of field with a key whose certificate is named tcbSignerCN and
// chains to roots at now. It returns the raw field for decoding.
func verifySigned(body, issuerPEM []byte, field string, roots *x509.CertPool, now time.Time) (json.RawMessage, []*x509.Certificate, error) {
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(body, &outer); err != nil {
		return nil, nil, untrustedErr("%s: not JSON: %w", field, err)
	}
	raw, ok := outer[field]
	var sigHex string
	if !ok || json.Unmarshal(outer["signature"], &sigHex) != nil {
		return nil, nil, untrustedErr("%s: want fields %q and \"signature\"", field, field)
	}
	signer, err := parseSigner(issuerPEM)
	if err != nil {
		return nil, nil, untrustedErr("%s signing chain: %w", field, err)
	}
	if signer.Subject.CommonName != tcbSignerCN {
		return nil, nil, untrustedErr("%s is signed by %q, not %q", field, signer.Subject.CommonName, tcbSignerCN)
	}
	chains, err := signer.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil, nil, untrustedErr("%s signing certificate: %w", field, err)
	}
	if err := checkP256Signature(signer, raw, sigHex); err != nil {
		return nil, nil, untrustedErr("%s signature: %w", field, err)
	}
	return raw, chains[0], nil
}

// parseSigner returns the first certificate of a PEM chain.
func parseSigner(issuerPEM []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(issuerPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// checkP256Signature verifies a raw r||s ECDSA P-256 signature (hex) over
// SHA-256 of msg, Intel's format for PCS responses and quotes.
func checkP256Signature(cert *x509.Certificate, msg []byte, sigHex string) error {
	sig, err := hex.DecodeString(sigHex)
	if err != nil || len(sig) != 64 {
		return errors.New("not 64 bytes of hex")
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return errors.New("signing key is not ECDSA")
	}
	digest := sha256.Sum256(msg)
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(pub, digest[:], r, s) {
		return errors.New("does not verify")
	}
	return nil
}

// window checks now against an item's issue date and next update.
func window(name string, issue, next, now time.Time) error {
	if now.Before(issue) {
		return staleErr("%s is issued %s, after now", name, issue.Format(time.RFC3339))
	}
	if now.After(next) {
		return staleErr("%s expired at %s (its next update); run `latchkey-verifier collateral fetch`", name, next.Format(time.RFC3339))
	}
	return nil
}

// tcbInfo returns the verified TDX TCB info of fmspc at now.
func (c *Collateral) tcbInfo(fmspc string, roots *x509.CertPool, now time.Time) (*pcs.TcbInfo, *signedItem, error) {
	name := TCBInfoFileName(fmspc)
	info, item, err := signedFile[pcs.TcbInfo](c, name, "tcbInfo", roots, now)
	if err != nil {
		return nil, nil, err
	}
	if info.ID != "TDX" || info.Version != 3 {
		return nil, nil, untrustedErr("%s is %q version %d, want TDX version 3", name, info.ID, info.Version)
	}
	if len(info.TcbLevels) == 0 {
		return nil, nil, untrustedErr("%s has no TCB levels", name)
	}
	if !bytesEqualFold(info.Fmspc, fmspc) {
		return nil, nil, untrustedErr("%s is for FMSPC %s", name, info.Fmspc)
	}
	return info, item, window("TCB info "+name, info.IssueDate, info.NextUpdate, now)
}

// qeIdentity returns the verified TD QE identity at now.
func (c *Collateral) qeIdentity(roots *x509.CertPool, now time.Time) (*pcs.EnclaveIdentity, *signedItem, error) {
	id, item, err := signedFile[pcs.EnclaveIdentity](c, qeIdentityFile, "enclaveIdentity", roots, now)
	if err != nil {
		return nil, nil, err
	}
	if id.ID != "TD_QE" || id.Version != 2 {
		return nil, nil, untrustedErr("%s is %q version %d, want TD_QE version 2", qeIdentityFile, id.ID, id.Version)
	}
	if len(id.TcbLevels) == 0 {
		return nil, nil, untrustedErr("%s has no TCB levels", qeIdentityFile)
	}
	return id, item, window("QE identity", id.IssueDate, id.NextUpdate, now)
}

// signedFile returns the decoded signed item in name, its signature and
// signing chain verified against roots (once per content and roots; at
// later joins only the chain's validity at now is re-checked). The
// returned value is shared: callers only read it.
func signedFile[T any](c *Collateral, name, field string, roots *x509.CertPool, now time.Time) (*T, *signedItem, error) {
	body, err := c.read(name)
	if err != nil {
		return nil, nil, staleErr("no %s in the collateral cache %s; run `latchkey-verifier collateral fetch`", name, c.dir)
	}
	issuer, err := c.read(name + issuerSuffix)
	if err != nil {
		return nil, nil, staleErr("no %s in the collateral cache %s; run `latchkey-verifier collateral fetch`", name+issuerSuffix, c.dir)
	}
	h := sha256.New()
	h.Write(body)
	h.Write([]byte{0})
	h.Write(issuer)
	key := verifiedKey{name: name, roots: roots}
	h.Sum(key.digest[:0])
	if v, ok := c.lookup(key); ok {
		if now.Before(v.notBefore) || now.After(v.notAfter) {
			return nil, nil, untrustedErr("%s signing certificate: not valid at %s", field, now.Format(time.RFC3339))
		}
		return v.value.(*T), &signedItem{signer: v.signer}, nil
	}
	raw, chain, err := verifySigned(body, issuer, field, roots, now)
	if err != nil {
		return nil, nil, err
	}
	into := new(T)
	if err := json.Unmarshal(raw, into); err != nil {
		return nil, nil, untrustedErr("%s: %w", name, err)
	}
	nb, na := chainWindow(chain)
	c.remember(key, verifiedItem{value: into, signer: chain[0], notBefore: nb, notAfter: na})
	return into, &signedItem{signer: chain[0]}, nil
}

// crl returns the CRL in name, its signature checked against issuer and
// its dates against now.
func (c *Collateral) crl(name string, issuer *x509.Certificate, now time.Time) (*x509.RevocationList, error) {
	der, err := c.read(name)
	if err != nil {
		return nil, staleErr("no %s in the collateral cache %s; run `latchkey-verifier collateral fetch`", name, c.dir)
	}
	key := verifiedKey{name: name, digest: sha256.Sum256(der), issuer: sha256.Sum256(issuer.Raw)}
	var crl *x509.RevocationList
	if v, ok := c.lookup(key); ok {
		crl = v.value.(*x509.RevocationList)
	} else {
		if crl, err = x509.ParseRevocationList(der); err != nil {
			return nil, untrustedErr("%s: %w", name, err)
		}
		if err := crl.CheckSignatureFrom(issuer); err != nil {
			return nil, untrustedErr("%s is not signed by %q: %w", name, issuer.Subject.CommonName, err)
		}
		c.remember(key, verifiedItem{value: crl})
	}
	return crl, window("CRL "+name, crl.ThisUpdate, crl.NextUpdate, now)
}

// revoked reports whether crl lists cert.
func revoked(crl *x509.RevocationList, cert *x509.Certificate) bool {
	for _, e := range crl.RevokedCertificateEntries {
		if e.SerialNumber.Cmp(cert.SerialNumber) == 0 {
			return true
		}
	}
	return false
}

func bytesEqualFold(a, b string) bool { return bytes.EqualFold([]byte(a), []byte(b)) }
