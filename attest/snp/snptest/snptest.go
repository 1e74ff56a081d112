// Package snptest makes genuinely signed AMD SEV-SNP reports for tests, on
// machines without SEV-SNP, with go-sev-guest's test signer: a fake ARK ->
// ASK -> VCEK (and ASVK -> VLEK) chain with AMD's certificate profile,
// reports from its CreateRawReport, and its TcQuoteProvider.
//
// It imports Go's testing package and go-sev-guest's testing package,
// which registers global flags (-product, -product_name, -test_kds,
// -test_use_kds). Only tests may import it; the shipped binaries
// (latchkey-agent, latchkey-verifier) never do.
package snptest

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	test "github.com/google/go-sev-guest/testing"
	"github.com/google/uuid"

	"github.com/latchkey/latchkey/attest/snp"
	snpissuer "github.com/latchkey/latchkey/attest/snp/issuer"
	snpwire "github.com/latchkey/latchkey/attest/snp/wire"
)

var (
	// DefaultMeasurement is the launch measurement of reports made with
	// zero Options.
	DefaultMeasurement = digest384("latchkey snptest launch measurement")
	// DefaultChipID is the CHIP_ID (and VCEK HWID) of zero Options.
	DefaultChipID = digest512("latchkey snptest chip")
	// DefaultTCB is the TCB of zero Options (a Milan TCB seen in the wild).
	DefaultTCB = kds.TCBParts{BlSpl: 3, TeeSpl: 0, SnpSpl: 8, UcodeSpl: 115}
)

// Options shape a Signer's chain and its reports. Zero fields take the
// defaults named on each.
type Options struct {
	// ProductLine is Milan (default), Genoa or Turin. Reports are
	// version 3 and carry the product's CPUID.
	ProductLine string
	// Measurement (48 bytes) defaults to DefaultMeasurement.
	Measurement []byte
	// GuestPolicy is the report's guest policy (zero: no debug, no
	// migration agent, SMT not allowed).
	GuestPolicy abi.SnpPolicy
	// TCB is the reported, current, committed and launch TCB and the one
	// the VCEK certifies; zero means DefaultTCB.
	TCB *kds.TCBParts
	// GuestSVN, VMPL and PlatformInfo are copied into the report.
	GuestSVN     uint32
	VMPL         uint32
	PlatformInfo uint64
	// ChipID (64 bytes) defaults to DefaultChipID.
	ChipID []byte
	// Identity fields, zero when nil.
	HostData, FamilyID, ImageID, IDKeyDigest, AuthorKeyDigest []byte
	// VLEK makes the reports VLEK-signed (ASVK chain) instead of VCEK.
	VLEK bool
	// Keys replaces go-sev-guest's fixed test keys (e.g. a different ARK
	// key makes a chain no default policy trusts).
	Keys *test.AmdKeys
	// Now is when the fake chain was issued (default: an hour ago).
	Now time.Time
}

// Edit changes a report before it is signed.
type Edit func(*spb.Report)

// Signer holds a fake AMD chain and signs reports with its VCEK or VLEK.
// Its methods are safe for concurrent use.
type Signer struct {
	// AMD is go-sev-guest's test signer: the chain and its private keys.
	AMD     *test.AmdSigner
	opts    Options
	tcb     kds.TCBVersion
	product *spb.SevProduct
	table   []byte
	tb      testing.TB
}

// New returns a Signer with zero Options.
func New(tb testing.TB) *Signer { return NewWithOptions(tb, Options{}) }

// NewWithOptions builds a fake chain whose VCEK (or VLEK) certifies o's
// chip and TCB.
func NewWithOptions(tb testing.TB, o Options) *Signer {
	tb.Helper()
	s, err := build(o)
	if err != nil {
		tb.Fatalf("snptest: %v", err)
	}
	s.tb = tb
	return s
}

func build(o Options) (*Signer, error) {
	o = withDefaults(o)
	product, err := kds.ParseProductLine(o.ProductLine)
	if err != nil {
		return nil, err
	}
	product.MachineStepping = abi.DefaultSevProduct().GetMachineStepping()
	tcb, err := kds.ComposeTCBParts(*o.TCB)
	if err != nil {
		return nil, err
	}
	amd, err := newAMDSigner(o, product, tcb)
	if err != nil {
		return nil, err
	}
	s := &Signer{AMD: amd, opts: o, tcb: tcb, product: product}
	s.table = s.certTable()
	return s, nil
}

func withDefaults(o Options) Options {
	if o.ProductLine == "" {
		o.ProductLine = "Milan"
	}
	if o.Measurement == nil {
		o.Measurement = DefaultMeasurement
	}
	if o.TCB == nil {
		t := DefaultTCB
		o.TCB = &t
	}
	if o.ChipID == nil {
		o.ChipID = DefaultChipID
	}
	if o.Keys == nil {
		o.Keys = test.DefaultAmdKeys()
	}
	if o.Now.IsZero() {
		o.Now = time.Now().Add(-time.Hour)
	}
	return o
}

// newAMDSigner certifies the chain with go-sev-guest's AmdSignerBuilder,
// with VCEK/VLEK extensions naming the chip and TCB.
func newAMDSigner(o Options, product *spb.SevProduct, tcb kds.TCBVersion) (*test.AmdSigner, error) {
	name := kds.ProductName(product)
	b := &test.AmdSignerBuilder{
		Keys: o.Keys, ProductName: name, CSPID: "latchkey-snptest", TCB: tcb,
		ArkCreationTime: o.Now, AskCreationTime: o.Now, AsvkCreationTime: o.Now,
		VcekCreationTime: o.Now, VlekCreationTime: o.Now,
		VcekCustom: test.CertOverride{Extensions: test.CustomExtensions(*o.TCB, o.ChipID, "", name)},
		VlekCustom: test.CertOverride{Extensions: test.CustomExtensions(*o.TCB, nil, "latchkey-snptest", name)},
	}
	copy(b.HWID[:], o.ChipID)
	amd, err := b.TestOnlyCertChain()
	if err != nil {
		return nil, fmt.Errorf("fake AMD chain: %w", err)
	}
	amd.Product = product
	return amd, nil
}

// certTable is what a host returns with an extended report: the signing
// key's certificate, its intermediate and the ARK.
func (s *Signer) certTable() []byte {
	ek, ica := s.AMD.Vcek.Raw, s.AMD.Ask.Raw
	ekGUID := abi.VcekGUID
	if s.opts.VLEK {
		ek, ica, ekGUID = s.AMD.Vlek.Raw, s.AMD.Asvk.Raw, abi.VlekGUID
	}
	t := abi.CertTable{Entries: []abi.CertTableEntry{
		{GUID: uuid.MustParse(ekGUID), RawCert: ek},
		{GUID: uuid.MustParse(abi.AskGUID), RawCert: ica},
		{GUID: uuid.MustParse(abi.ArkGUID), RawCert: s.AMD.Ark.Raw},
	}}
	return t.Marshal()
}

// Template is the unsigned report every signed report starts from, with
// REPORT_DATA zero. It begins as go-sev-guest's CreateRawReport.
func (s *Signer) Template() *spb.Report {
	signer := abi.SignerInfo{SigningKey: abi.VcekReportSigner}
	if s.opts.VLEK {
		signer.SigningKey = abi.VlekReportSigner
	}
	raw := test.CreateRawReport(&test.TestReportOptions{
		SignerInfo: signer, Version: abi.ReportVersion3,
		FMS: abi.MaskedCpuid1EaxFromSevProduct(s.product),
	})
	r, err := abi.ReportToProto(raw[:abi.ReportSize])
	if err != nil {
		panic(fmt.Sprintf("snptest: go-sev-guest's raw report does not parse: %v", err))
	}
	o := s.opts
	r.Policy = abi.SnpPolicyToBytes(o.GuestPolicy)
	r.Measurement = clone(o.Measurement, abi.MeasurementSize)
	r.CurrentTcb, r.ReportedTcb, r.CommittedTcb, r.LaunchTcb = uint64(s.tcb), uint64(s.tcb), uint64(s.tcb), uint64(s.tcb)
	r.GuestSvn, r.Vmpl, r.PlatformInfo = o.GuestSVN, o.VMPL, o.PlatformInfo
	r.ChipId = clone(o.ChipID, abi.ChipIDSize)
	r.HostData = clone(o.HostData, abi.HostDataSize)
	r.FamilyId = clone(o.FamilyID, abi.FamilyIDSize)
	r.ImageId = clone(o.ImageID, abi.ImageIDSize)
	r.IdKeyDigest = clone(o.IDKeyDigest, abi.IDKeyDigestSize)
	r.AuthorKeyDigest = clone(o.AuthorKeyDigest, abi.AuthorKeyDigestSize)
	return r
}

// SignReport returns a raw report with reportData (at most 64 bytes,
// zero-padded) after edits, signed by the chain's VCEK (VLEK). It signs
// with crypto/rand rather than go-sev-guest's AmdSigner.Sign, whose shared
// math/rand source is not safe for concurrent use, so load tests can sign
// from many goroutines.
func (s *Signer) SignReport(reportData []byte, edits ...Edit) ([]byte, error) {
	if len(reportData) > abi.ReportDataSize {
		return nil, fmt.Errorf("report data of %d bytes", len(reportData))
	}
	r := s.Template()
	r.ReportData = clone(reportData, abi.ReportDataSize)
	for _, e := range edits {
		e(r)
	}
	raw, err := abi.ReportToAbiBytes(r)
	if err != nil {
		return nil, err
	}
	key := s.AMD.Keys.Vcek
	if info, _ := abi.ParseSignerInfo(r.SignerInfo); info.SigningKey == abi.VlekReportSigner {
		key = s.AMD.Keys.Vlek
	}
	return raw, signRaw(raw, key)
}

// SignRawWith re-signs a raw report in place with key (for reports signed
// by a key outside the chain).
func SignRawWith(raw []byte, key *ecdsa.PrivateKey) error { return signRaw(raw, key) }

func signRaw(raw []byte, key *ecdsa.PrivateKey) error {
	digest := sha512.Sum384(abi.SignedComponent(raw))
	r, sig, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		return err
	}
	return abi.SetSignature(r, sig, raw)
}

// Report is SignReport that fails the test on error.
func (s *Signer) Report(reportData []byte, edits ...Edit) []byte {
	s.tb.Helper()
	raw, err := s.SignReport(reportData, edits...)
	if err != nil {
		s.tb.Fatalf("snptest: sign report: %v", err)
	}
	return raw
}

// Evidence returns serialized SNPEvidence for binding: a signed report
// whose REPORT_DATA is binding and zeros, with the certificate table.
func (s *Signer) Evidence(binding []byte, edits ...Edit) []byte {
	s.tb.Helper()
	return s.encode(s.Report(binding, edits...), s.table)
}

// EvidenceWithoutTable is Evidence from a host that supplies no
// certificate table, so the verifier needs collateral.
func (s *Signer) EvidenceWithoutTable(binding []byte, edits ...Edit) []byte {
	s.tb.Helper()
	return s.encode(s.Report(binding, edits...), nil)
}

func (s *Signer) encode(report, table []byte) []byte {
	s.tb.Helper()
	ev, err := snpwire.EncodeEvidence(report, table)
	if err != nil {
		s.tb.Fatalf("snptest: %v", err)
	}
	return ev
}

// CertTable is the certificate table hosts of this chain supply.
func (s *Signer) CertTable() []byte { return clone(s.table, len(s.table)) }

// VCEK is the DER VCEK certificate.
func (s *Signer) VCEK() []byte { return clone(s.AMD.Vcek.Raw, len(s.AMD.Vcek.Raw)) }

// ChipID is the CHIP_ID of the reports.
func (s *Signer) ChipID() []byte { return clone(s.opts.ChipID, abi.ChipIDSize) }

// TCB is the REPORTED_TCB of the reports.
func (s *Signer) TCB() uint64 { return uint64(s.tcb) }

// ProductLine is the product line of the chain and the reports.
func (s *Signer) ProductLine() string { return s.opts.ProductLine }

// TrustedRoots is the fake chain's roots as a Policy.TrustedRoots value:
// the ASK and the ASVK bundles, each with the ARK.
func (s *Signer) TrustedRoots() []snp.TrustedRoot {
	ark := pemOf(s.AMD.Ark.Raw)
	return []snp.TrustedRoot{
		{ProductLine: s.opts.ProductLine, CertChain: pemOf(s.AMD.Ask.Raw) + ark},
		{ProductLine: s.opts.ProductLine, CertChain: pemOf(s.AMD.Asvk.Raw) + ark},
	}
}

// Policy accepts exactly this Signer's unedited reports, trusting its
// fake roots.
func (s *Signer) Policy() snp.Policy {
	o := s.opts
	p := snp.Policy{
		Measurements:        []string{hex.EncodeToString(o.Measurement)},
		MinimumTCB:          snpwire.TCBFromVersion(uint64(s.tcb)),
		MinimumGuestSVN:     o.GuestSVN,
		AllowMigrationAgent: o.GuestPolicy.MigrateMA,
		AllowCXL:            o.GuestPolicy.CXLAllowed,
		VMPLs:               []uint32{o.VMPL},
		TrustedRoots:        s.TrustedRoots(),
	}
	if info, _ := abi.ParseSnpPlatformInfo(o.PlatformInfo); info.SMTEnabled {
		p.SMT = snp.SMTAllowed
	}
	return p
}

// QuoteProvider is a client.QuoteProvider and client.LeveledQuoteProvider
// that signs a fresh report for any REPORT_DATA (and VMPL), followed by
// the certificate table, as the configfs-tsm provider returns them. Safe
// for concurrent use.
type QuoteProvider struct{ s *Signer }

var (
	_ client.QuoteProvider        = (*QuoteProvider)(nil)
	_ client.LeveledQuoteProvider = (*QuoteProvider)(nil)
)

// QuoteProvider returns a provider signing with this Signer's chain.
func (s *Signer) QuoteProvider() *QuoteProvider { return &QuoteProvider{s: s} }

// IsSupported is true.
func (q *QuoteProvider) IsSupported() bool { return true }

// GetRawQuote signs a report at the Signer's VMPL.
func (q *QuoteProvider) GetRawQuote(data [64]byte) ([]byte, error) {
	return q.GetRawQuoteAtLevel(data, uint(q.s.opts.VMPL))
}

// GetRawQuoteAtLevel signs a report at vmpl.
func (q *QuoteProvider) GetRawQuoteAtLevel(data [64]byte, vmpl uint) ([]byte, error) {
	raw, err := q.s.SignReport(data[:], func(r *spb.Report) { r.Vmpl = uint32(vmpl) })
	if err != nil {
		return nil, err
	}
	return append(raw, q.s.table...), nil
}

// Product is the Signer's product.
func (q *QuoteProvider) Product() *spb.SevProduct { return q.s.product }

// TcQuoteProvider is go-sev-guest's test quote provider answering each of
// reportData with this Signer's template report, signed by its chain.
// It is not safe for concurrent use (go-sev-guest signs with a shared
// math/rand source).
func (s *Signer) TcQuoteProvider(reportData ...[64]byte) *test.QuoteProvider {
	s.tb.Helper()
	var tcs []test.TestCase
	for _, d := range reportData {
		r := s.Template()
		r.ReportData = d[:]
		raw, err := abi.ReportToAbiBytes(r)
		if err != nil {
			s.tb.Fatalf("snptest: %v", err)
		}
		tc := test.TestCase{Name: hex.EncodeToString(d[:8]), Input: d}
		copy(tc.Output[:], raw)
		tcs = append(tcs, tc)
	}
	qp, err := test.TcQuoteProvider(tcs, &test.DeviceOptions{Signer: s.AMD, Product: s.product, Now: s.opts.Now})
	if err != nil {
		s.tb.Fatalf("snptest: %v", err)
	}
	qp.Device.Certs = s.table
	return qp
}

// Issuer is an snpissuer.Issuer over QuoteProvider.
func (s *Signer) Issuer() *snpissuer.Issuer {
	s.tb.Helper()
	iss, err := snpissuer.New(snpissuer.Config{QuoteProvider: s.QuoteProvider()})
	if err != nil {
		s.tb.Fatalf("snptest: %v", err)
	}
	return iss
}

func pemOf(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// clone copies b into a new slice of n bytes (zero-padded or truncated).
func clone(b []byte, n int) []byte {
	out := make([]byte, n)
	copy(out, b)
	return out
}

func digest384(s string) []byte {
	d := sha512.Sum384([]byte(s))
	return d[:]
}

func digest512(s string) []byte {
	d := sha512.Sum512([]byte(s))
	return d[:]
}
