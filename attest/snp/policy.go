package snp

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/wire"
)

// The policy document's snp section lives in attest/snp/wire, which the
// agent's measure command prints too.
type (
	// Policy is the policy document's snp section (wire.Policy).
	Policy = wire.Policy
	// TCB is a minimum TCB version by component (wire.TCB).
	TCB = wire.TCB
	// SMTMode is Policy.SMT (wire.SMTMode).
	SMTMode = wire.SMTMode
	// TrustedRoot is one trusted AMD chain (wire.TrustedRoot).
	TrustedRoot = wire.TrustedRoot
)

// The SMT modes (wire.SMTForbidden, wire.SMTAllowed).
const (
	SMTForbidden = wire.SMTForbidden
	SMTAllowed   = wire.SMTAllowed
)

// tcbParts returns t in go-sev-guest's representation.
func tcbParts(t TCB) kds.TCBParts {
	return kds.TCBParts{BlSpl: t.Bootloader, TeeSpl: t.TEE, SnpSpl: t.SNP, UcodeSpl: t.Microcode}
}

// compiled is a Policy with every value decoded, ready for the hot path.
type compiled struct {
	measurements  attest.ByteSet
	minTCB        kds.TCBParts
	minGuestSVN   uint32
	provisional   bool
	allowMA       bool
	allowCXL      bool
	smt           SMTMode
	vmpls         [4]bool
	idKeys        attest.ByteSet
	authorKeys    attest.ByteSet
	familyIDs     attest.ByteSet
	imageIDs      attest.ByteSet
	hostData      attest.ByteSet
	bindHostData  bool
	roots         map[string][]*trust.AMDRootCerts
	rootsNotAfter map[string]time.Time
}

func compile(p Policy) (*compiled, error) {
	c := &compiled{
		minTCB:       tcbParts(p.MinimumTCB),
		minGuestSVN:  p.MinimumGuestSVN,
		provisional:  p.PermitProvisionalFirmware,
		allowMA:      p.AllowMigrationAgent,
		allowCXL:     p.AllowCXL,
		bindHostData: p.BindHostData,
	}
	if _, err := kds.ComposeTCBParts(c.minTCB); err != nil {
		return nil, fmt.Errorf("minimumTCB: %w", err)
	}
	var err error
	if c.smt, err = parseSMT(p.SMT); err != nil {
		return nil, err
	}
	if c.vmpls, err = parseVMPLs(p.VMPLs); err != nil {
		return nil, err
	}
	if err := c.compileLists(p); err != nil {
		return nil, err
	}
	if c.roots, err = compileRoots(p.TrustedRoots); err != nil {
		return nil, err
	}
	c.rootsNotAfter = rootsExpiry(c.roots)
	return c, nil
}

func (c *compiled) compileLists(p Policy) error {
	lists := []struct {
		dst  *attest.ByteSet
		src  []string
		size int
		name string
	}{
		{&c.measurements, p.Measurements, abi.MeasurementSize, "measurements"},
		{&c.idKeys, p.IDKeyDigests, abi.IDKeyDigestSize, "idKeyDigests"},
		{&c.authorKeys, p.AuthorKeyDigests, abi.AuthorKeyDigestSize, "authorKeyDigests"},
		{&c.familyIDs, p.FamilyIDs, abi.FamilyIDSize, "familyIDs"},
		{&c.imageIDs, p.ImageIDs, abi.ImageIDSize, "imageIDs"},
		{&c.hostData, p.HostData, abi.HostDataSize, "hostData"},
	}
	for _, l := range lists {
		set, err := attest.HexSet(l.src, l.size, l.name)
		if err != nil {
			return err
		}
		*l.dst = set
	}
	if c.measurements == nil {
		c.measurements = attest.ByteSet{} // nothing listed: nothing accepted
	}
	return nil
}

func parseSMT(m SMTMode) (SMTMode, error) {
	switch m {
	case "", SMTForbidden:
		return SMTForbidden, nil
	case SMTAllowed:
		return SMTAllowed, nil
	}
	return "", fmt.Errorf("smt: %q is neither %q nor %q", m, SMTForbidden, SMTAllowed)
}

func parseVMPLs(list []uint32) ([4]bool, error) {
	var out [4]bool
	if len(list) == 0 {
		out[0] = true
		return out, nil
	}
	for _, v := range list {
		if v > 3 {
			return out, fmt.Errorf("vmpls: %d is not a VMPL (0-3)", v)
		}
		out[v] = true
	}
	return out, nil
}

// productLines are the product lines go-sev-guest v0.15 knows roots for.
var productLines = []string{"Milan", "Genoa", "Turin"}

// defaultRoots parses go-sev-guest's embedded AMD chains once.
var defaultRoots = sync.OnceValues(func() (map[string][]*trust.AMDRootCerts, error) {
	bundles := map[string][][]byte{
		"Milan": {trust.AskArkMilanVcekBytes, trust.AskArkMilanVlekBytes},
		"Genoa": {trust.AskArkGenoaVcekBytes, trust.AskArkGenoaVlekBytes},
		"Turin": {trust.AskArkTurinVcekBytes, trust.AskArkTurinVlekBytes},
	}
	roots := map[string][]*trust.AMDRootCerts{}
	for line, list := range bundles {
		for _, b := range list {
			r, err := parseRoot(line, b)
			if err != nil {
				return nil, fmt.Errorf("embedded %s root: %w", line, err)
			}
			roots[line] = append(roots[line], r)
		}
	}
	return roots, nil
})

func compileRoots(list []TrustedRoot) (map[string][]*trust.AMDRootCerts, error) {
	if len(list) == 0 {
		return defaultRoots()
	}
	roots := map[string][]*trust.AMDRootCerts{}
	for i, tr := range list {
		r, err := parseRoot(tr.ProductLine, []byte(tr.CertChain))
		if err != nil {
			return nil, fmt.Errorf("trustedRoots[%d]: %w", i, err)
		}
		roots[tr.ProductLine] = append(roots[tr.ProductLine], r)
	}
	return roots, nil
}

// parseRoot parses one KDS cert_chain bundle with go-sev-guest's trust
// package and checks that the ARK is self-signed and signs the AS(V)K, so
// a wrong bundle fails at policy load rather than at every join.
func parseRoot(productLine string, bundle []byte) (*trust.AMDRootCerts, error) {
	if !slices.Contains(productLines, productLine) {
		return nil, fmt.Errorf("product line %q is not one of %v", productLine, productLines)
	}
	r := trust.AMDRootCertsProduct(productLine)
	// kds.ParseProductCertChain refuses trailing bytes, and a YAML block
	// scalar (or go-sev-guest's own Turin VLEK file) ends in blank lines.
	if err := r.FromKDSCertBytes(bytes.TrimSpace(bundle)); err != nil {
		return nil, fmt.Errorf("parse %s cert chain: %w", productLine, err)
	}
	pc := r.ProductCerts
	ica := pc.Ask
	if ica == nil {
		ica = pc.Asvk
	}
	if pc.Ark == nil || ica == nil {
		return nil, errors.New("cert chain needs an ASK or ASVK followed by an ARK")
	}
	if err := pc.Ark.CheckSignatureFrom(pc.Ark); err != nil {
		return nil, fmt.Errorf("ARK is not self-signed: %w", err)
	}
	if err := ica.CheckSignatureFrom(pc.Ark); err != nil {
		return nil, fmt.Errorf("ASK/ASVK is not signed by the ARK: %w", err)
	}
	return r, nil
}

// rootsExpiry returns, per product line, the earliest NotAfter of its
// trusted certificates: a cached chain verdict is not reused past it.
func rootsExpiry(roots map[string][]*trust.AMDRootCerts) map[string]time.Time {
	out := map[string]time.Time{}
	for line, list := range roots {
		var first time.Time
		for _, r := range list {
			for _, c := range []*x509.Certificate{r.ProductCerts.Ark, r.ProductCerts.Ask, r.ProductCerts.Asvk} {
				if c != nil && (first.IsZero() || c.NotAfter.Before(first)) {
					first = c.NotAfter
				}
			}
		}
		out[line] = first
	}
	return out
}
