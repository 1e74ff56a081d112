package snp

import (
	"bytes"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"
)

// Policy is the snp section of the verifier's policy file: the reference
// values an SEV-SNP report must match. It is parsed strictly and
// case-sensitively (verifier/policy, through internal/strictyaml), so field
// names are exactly the camelCase JSON tags below.
//
// Every reference value is a list, so an image upgrade rolls out by
// listing the old and new values together. The zero value accepts nothing:
// no measurement listed means no report passes, debug is always refused,
// the migration agent and SMT are refused, only VMPL 0 is accepted, and
// only AMD's own roots are trusted. Example:
//
//	measurements: ["<96 hex digits>"]
//	minimumTCB: {bootloader: 3, tee: 0, snp: 8, microcode: 115}
//	minimumGuestSVN: 0
//	smt: allowed
//	vmpls: [0]
type Policy struct {
	// Measurements lists the accepted launch measurements (48 bytes, hex).
	// The measurement changes with the image and with the vCPU count, so a
	// fleet lists one per image and vCPU shape.
	Measurements []string `json:"measurements,omitempty"`
	// MinimumTCB is the component-wise minimum of REPORTED_TCB.
	MinimumTCB TCB `json:"minimumTCB,omitempty"`
	// MinimumGuestSVN is the minimum GUEST_SVN (from the ID block).
	MinimumGuestSVN uint32 `json:"minimumGuestSVN,omitempty"`
	// PermitProvisionalFirmware accepts a report whose committed firmware
	// (TCB, build, API version) is older than the running one. False keeps
	// a host from rolling firmware back after attestation.
	PermitProvisionalFirmware bool `json:"permitProvisionalFirmware,omitempty"`
	// AllowMigrationAgent accepts a guest policy with MIGRATE_MA set (a
	// migration agent can export the guest's memory). Default: refused.
	AllowMigrationAgent bool `json:"allowMigrationAgent,omitempty"`
	// AllowCXL accepts a guest policy with CXL_ALLOW set. Default: refused.
	AllowCXL bool `json:"allowCXL,omitempty"`
	// SMT says whether the host may run with simultaneous multithreading:
	// "forbidden" (the default, also written "") requires PLATFORM_INFO's
	// SMT_EN bit clear, so no sibling thread shares a core with the guest;
	// "allowed" accepts either. There is no "required": nothing is gained
	// by insisting on SMT.
	SMT SMTMode `json:"smt,omitempty"`
	// VMPLs lists the accepted VM privilege levels the report was requested
	// at (0-3). Empty means [0].
	VMPLs []uint32 `json:"vmpls,omitempty"`
	// IDKeyDigests, when not empty, lists the accepted ID_KEY_DIGEST values
	// (SHA-384 of the ID block's signing key, 48 bytes, hex).
	IDKeyDigests []string `json:"idKeyDigests,omitempty"`
	// AuthorKeyDigests, when not empty, lists the accepted
	// AUTHOR_KEY_DIGEST values (48 bytes, hex) and requires AUTHOR_KEY_EN.
	AuthorKeyDigests []string `json:"authorKeyDigests,omitempty"`
	// FamilyIDs, when not empty, lists the accepted FAMILY_ID values
	// (16 bytes, hex).
	FamilyIDs []string `json:"familyIDs,omitempty"`
	// ImageIDs, when not empty, lists the accepted IMAGE_ID values
	// (16 bytes, hex).
	ImageIDs []string `json:"imageIDs,omitempty"`
	// HostData, when not empty, lists the accepted HOST_DATA values
	// (32 bytes, hex).
	HostData []string `json:"hostData,omitempty"`
	// BindHostData mixes HOST_DATA into the machine identity disk UUIDs
	// and node names are bound to ("snp-chip:<CHIP_ID>/host-data:<hex>"
	// instead of "snp-chip:<CHIP_ID>"). Set it only when the platform
	// gives every VM its own HOST_DATA that stays the same across its
	// restarts: co-tenant VMs on one chip then get different identities.
	// Off, every VM on a chip shares one identity.
	BindHostData bool `json:"bindHostData,omitempty"`
	// TrustedRoots, when not empty, replaces the AMD roots go-sev-guest
	// ships (Milan, Genoa, Turin; VCEK and VLEK chains) as the only trusted
	// roots. Tests use it for go-sev-guest's fake chain; operators for a
	// root rotation.
	TrustedRoots []TrustedRoot `json:"trustedRoots,omitempty"`
}

// TCB is a minimum SEV-SNP TCB version by component (security patch
// levels). A report passes when every component is at least the minimum.
type TCB struct {
	Bootloader uint8 `json:"bootloader,omitempty"`
	TEE        uint8 `json:"tee,omitempty"`
	SNP        uint8 `json:"snp,omitempty"`
	Microcode  uint8 `json:"microcode,omitempty"`
}

// SMTMode is Policy.SMT.
type SMTMode string

const (
	// SMTForbidden requires the host to run with SMT disabled. The empty
	// string means the same.
	SMTForbidden SMTMode = "forbidden"
	// SMTAllowed accepts hosts with SMT enabled.
	SMTAllowed SMTMode = "allowed"
)

// TrustedRoot is one trusted AMD certificate chain in the format AMD's KDS
// serves at .../vcek/v1/<product>/cert_chain: two PEM certificates, the ASK
// (or, for VLEK chains, the ASVK) followed by the self-signed ARK.
type TrustedRoot struct {
	// ProductLine is Milan, Genoa or Turin.
	ProductLine string `json:"productLine"`
	// CertChain is the PEM bundle: ASK or ASVK, then ARK.
	CertChain string `json:"certChain"`
}

// TCBParts returns t in go-sev-guest's representation.
func (t TCB) TCBParts() kds.TCBParts {
	return kds.TCBParts{BlSpl: t.Bootloader, TeeSpl: t.TEE, SnpSpl: t.SNP, UcodeSpl: t.Microcode}
}

// TCBFromVersion decomposes a TCB_VERSION value (as in REPORTED_TCB).
func TCBFromVersion(v uint64) TCB {
	p := kds.DecomposeTCBVersion(kds.TCBVersion(v))
	return TCB{Bootloader: p.BlSpl, TEE: p.TeeSpl, SNP: p.SnpSpl, Microcode: p.UcodeSpl}
}

// compiled is a Policy with every value decoded, ready for the hot path.
type compiled struct {
	measurements  byteSet
	minTCB        kds.TCBParts
	minGuestSVN   uint32
	provisional   bool
	allowMA       bool
	allowCXL      bool
	smt           SMTMode
	vmpls         [4]bool
	idKeys        byteSet
	authorKeys    byteSet
	familyIDs     byteSet
	imageIDs      byteSet
	hostData      byteSet
	bindHostData  bool
	roots         map[string][]*trust.AMDRootCerts
	rootsNotAfter map[string]time.Time
}

// byteSet is a set of fixed-size byte strings; nil means "not checked".
type byteSet map[string]struct{}

func (s byteSet) has(b []byte) bool {
	_, ok := s[string(b)]
	return ok
}

func compile(p Policy) (*compiled, error) {
	c := &compiled{
		minTCB:       p.MinimumTCB.TCBParts(),
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
		dst  *byteSet
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
		set, err := hexSet(l.src, l.size, l.name)
		if err != nil {
			return err
		}
		*l.dst = set
	}
	if c.measurements == nil {
		c.measurements = byteSet{} // nothing listed: nothing accepted
	}
	return nil
}

// hexSet decodes a list of hex values of one size; nil for an empty list.
func hexSet(list []string, size int, name string) (byteSet, error) {
	if len(list) == 0 {
		return nil, nil
	}
	set := make(byteSet, len(list))
	for i, s := range list {
		b, err := hex.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: not hex: %w", name, i, err)
		}
		if len(b) != size {
			return nil, fmt.Errorf("%s[%d]: %d bytes, want %d", name, i, len(b), size)
		}
		set[string(b)] = struct{}{}
	}
	return set, nil
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
