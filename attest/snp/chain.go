package snp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// maxCachedChains bounds the verified-chain cache. Only chains that reach
// a trusted root are cached, so every entry is a real AMD chip (or CSP)
// key; the bound only guards memory against a policy that trusts a test
// root.
const maxCachedChains = 1 << 14

// endorsement is a VCEK or VLEK certificate whose chain to a trusted root
// go-sev-guest verified, with the fields each report is matched against.
type endorsement struct {
	cert        *x509.Certificate
	kind        abi.ReportSigner
	hwid        []byte
	tcb         uint64
	productLine string
	// notAfter is the earliest expiry along the chain; the cached verdict
	// is not used past it.
	notAfter time.Time
}

// chainCache maps the SHA-256 of an endorsement key certificate's DER to
// its verified *endorsement. Reads take no lock.
type chainCache struct {
	m sync.Map
	n atomic.Int64
}

func (c *chainCache) load(key [sha256.Size]byte, now time.Time) (*endorsement, bool) {
	v, ok := c.m.Load(key)
	if !ok {
		return nil, false
	}
	e := v.(*endorsement)
	if !now.Before(e.notAfter) {
		if c.m.CompareAndDelete(key, v) {
			c.n.Add(-1)
		}
		return nil, false
	}
	return e, true
}

func (c *chainCache) store(key [sha256.Size]byte, e *endorsement) {
	if c.n.Load() >= maxCachedChains {
		return
	}
	if _, loaded := c.m.LoadOrStore(key, e); !loaded {
		c.n.Add(1)
	}
}

// checkEndorsement runs checks 3 (chain) and 4 (signature) of Verify.
// A certificate seen before costs one signature verification; a new one
// is verified by go-sev-guest's verify.SnpAttestation (KDS certificate
// profile, chain to the trusted roots, validity now, report signature)
// and cached.
func (v *Validator) checkEndorsement(ctx context.Context, ev *wire.Evidence, der []byte) (*endorsement, error) {
	now := v.now()
	key := sha256.Sum256(der)
	if e, ok := v.chains.load(key, now); ok {
		if err := e.matches(ev); err != nil {
			return nil, err
		}
		return e, checkSignature(ev, e.cert)
	}
	e, err := v.verifyNew(ctx, ev, der, now)
	if err != nil {
		return nil, err
	}
	v.chains.store(key, e)
	return e, nil
}

// verifyNew verifies a certificate not in the cache with go-sev-guest's
// verify.SnpAttestation, which checks chain and report signature together.
// Its signature check covers the report as re-encoded from its parsed
// form; when that is byte for byte the report the chip signed (every
// well-formed report), the signature is not verified a second time: a
// first join pays one P-384 verification, not two. Only a failure, or a
// report that does not re-encode to itself, re-checks in Verify's order,
// so a bad signature is reported as such only when the certificate does
// chain to a trusted root.
func (v *Validator) verifyNew(ctx context.Context, ev *wire.Evidence, der []byte, now time.Time) (*endorsement, error) {
	e, err := v.parseEndorsement(ev, der)
	if err != nil {
		return nil, err
	}
	chain := &spb.CertificateChain{}
	if e.kind == abi.VlekReportSigner {
		chain.VlekCert = der
	} else {
		chain.VcekCert = der
	}
	opts := &verify.Options{DisableCertFetching: true, TrustedRoots: v.c.roots, Now: now}
	attErr := verify.SnpAttestationContext(ctx, &spb.Attestation{Report: ev.Report, CertificateChain: chain}, opts)
	if attErr != nil || !reencodesToRaw(ev) {
		if sigErr := checkSignature(ev, e.cert); sigErr != nil {
			if err := v.x509Chain(e.cert, e.kind, now); err != nil {
				return nil, untrusted("%v certificate does not chain to a trusted root: %w", e.kind, err)
			}
			if err := e.matches(ev); err != nil {
				return nil, err
			}
			return nil, sigErr
		}
	}
	if attErr != nil {
		return nil, untrusted("%v certificate chain: %w", e.kind, attErr)
	}
	if err := e.matches(ev); err != nil {
		return nil, err
	}
	return e, nil
}

// reencodesToRaw reports whether the parsed report encodes back to the
// bytes the chip signed: then a signature verified over the one (as
// verify.SnpAttestation does) is verified over the other.
func reencodesToRaw(ev *wire.Evidence) bool {
	b, err := abi.ReportToAbiBytes(ev.Report)
	return err == nil && bytes.Equal(b, ev.Raw)
}

// parseEndorsement parses the certificate and its KDS extensions with
// go-sev-guest (trust.ParseCert, kds.CertificateExtensions).
func (v *Validator) parseEndorsement(ev *wire.Evidence, der []byte) (*endorsement, error) {
	kind := ev.Signer.SigningKey
	// The parsed certificate aliases its input and outlives this join in
	// the cache, so it gets its own copy.
	cert, err := trust.ParseCert(bytes.Clone(der))
	if err != nil {
		return nil, untrusted("parse %v certificate: %w", kind, err)
	}
	exts, err := kds.CertificateExtensions(cert, kind)
	if err != nil {
		return nil, untrusted("%v certificate extensions: %w", kind, err)
	}
	line := reportProductLine(ev.Report)
	if line == "" {
		if p, err := kds.ParseProductName(exts.ProductName, kind); err == nil {
			line = kds.ProductLine(p)
		}
	}
	notAfter := cert.NotAfter
	if rootsEnd, ok := v.c.rootsNotAfter[line]; ok && rootsEnd.Before(notAfter) {
		notAfter = rootsEnd
	}
	return &endorsement{
		cert: cert, kind: kind, hwid: exts.HWID, tcb: uint64(exts.TCBVersion),
		productLine: line, notAfter: notAfter,
	}, nil
}

// x509Chain reports whether cert chains to any trusted root, using the
// verification options go-sev-guest's trust package builds. It only
// decides which reason a report with a bad signature gets.
func (v *Validator) x509Chain(cert *x509.Certificate, kind abi.ReportSigner, now time.Time) error {
	for _, list := range v.c.roots {
		for _, r := range list {
			opts := r.X509Options(now, kind)
			if opts == nil {
				continue
			}
			if _, err := cert.Verify(*opts); err == nil {
				return nil
			}
		}
	}
	return fmt.Errorf("no trusted %v chain verifies it", kind)
}

// matches checks that the certified key belongs to the report: same key
// kind, the VCEK's HWID is the report's CHIP_ID (unless the host masks
// it), and the certificate's TCB is the report's REPORTED_TCB.
func (e *endorsement) matches(ev *wire.Evidence) error {
	r := ev.Report
	if e.kind != ev.Signer.SigningKey {
		return untrusted("certificate is a %v, report is signed by a %v", e.kind, ev.Signer.SigningKey)
	}
	if e.kind == abi.VcekReportSigner && !allZero(r.GetChipId()) && !bytes.Equal(e.hwid, r.GetChipId()) {
		return untrusted("VCEK was issued for chip %s, report is from chip %s",
			hex.EncodeToString(e.hwid), hex.EncodeToString(r.GetChipId()))
	}
	if e.tcb != r.GetReportedTcb() {
		return untrusted("%v certifies TCB %#016x, report's REPORTED_TCB is %#016x", e.kind, e.tcb, r.GetReportedTcb())
	}
	return nil
}

// checkSignature verifies the report signature with go-sev-guest.
func checkSignature(ev *wire.Evidence, cert *x509.Certificate) error {
	if err := verify.SnpReportSignature(ev.Raw, cert); err != nil {
		return attest.Refuse(latchkeyv1.Reason_BAD_SIGNATURE, "report signature: %w", err)
	}
	return nil
}

// reportProductLine is the product line of a version 3+ report (from its
// CPUID family/model/stepping), "" for older reports.
func reportProductLine(r *spb.Report) string {
	fms := r.GetCpuid1EaxFms()
	if fms == 0 {
		return ""
	}
	line := kds.ProductLineFromFms(fms)
	if line == "Unknown" {
		return ""
	}
	return line
}

func untrusted(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_UNTRUSTED_CHAIN, format, args...)
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
