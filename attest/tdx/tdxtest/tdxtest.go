// Package tdxtest signs TDX quotes and Intel-style collateral with a fake
// PCK chain, as go-sev-guest's test signer does for SNP: a root CA, a PCK
// platform CA and a PCK certificate with the SGX extensions, a TCB
// signing certificate, and quotes whose QE report the PCK key signs and
// whose body the attestation key signs. It is test-only (never linked by
// the shipped binaries): tests use it for what no recorded quote can
// give, a quote of any content, revoked certificates, every TCB status.
package tdxtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	tdxtesting "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"
	"google.golang.org/protobuf/proto"
)

// FMSPC is the platform family of the fake PCK certificate.
const FMSPC = "00906ed50000"

// RootCRLURL is the fake root's CRL distribution point.
const RootCRLURL = "https://tdxtest.invalid/root.crl"

// Signer holds the fake chain and keys.
type Signer struct {
	t                         testing.TB
	Root, Inter, PCK, TCBSign *x509.Certificate
	rootKey, interKey, pckKey *ecdsa.PrivateKey
	tcbKey, attestKey         *ecdsa.PrivateKey
	// PPID is the PCK certificate's platform provisioning ID.
	PPID []byte
	// CPUSVN and PCESVN are the PCK certificate's TCB.
	CPUSVN []byte
	PCESVN int
	// NotBefore and NotAfter bound every certificate.
	NotBefore, NotAfter time.Time
	template            *pb.QuoteV4
}

// New makes a chain valid from now-1y to now+1y around at.
func New(t testing.TB, at time.Time) *Signer {
	t.Helper()
	s := &Signer{t: t, PPID: []byte("tdxtest-ppid-016"), CPUSVN: []byte{5, 5, 2, 2, 3, 1, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0}, PCESVN: 11,
		NotBefore: at.AddDate(-1, 0, 0), NotAfter: at.AddDate(1, 0, 0)}
	for _, k := range []**ecdsa.PrivateKey{&s.rootKey, &s.interKey, &s.pckKey, &s.tcbKey, &s.attestKey} {
		*k = newKey(t)
	}
	s.Root = s.cert(&x509.Certificate{Subject: name("Intel SGX Root CA"), IsCA: true, MaxPathLen: 1,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, CRLDistributionPoints: []string{RootCRLURL}}, nil, s.rootKey, s.rootKey)
	s.Inter = s.cert(&x509.Certificate{Subject: name("Intel SGX PCK Platform CA"), IsCA: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}, s.Root, s.rootKey, s.interKey)
	s.TCBSign = s.cert(&x509.Certificate{Subject: name("Intel SGX TCB Signing"), KeyUsage: x509.KeyUsageDigitalSignature},
		s.Root, s.rootKey, s.tcbKey)
	s.PCK = s.cert(&x509.Certificate{Subject: name("Intel SGX PCK Certificate"), KeyUsage: x509.KeyUsageDigitalSignature,
		SubjectKeyId: []byte{1, 2, 3, 4}, CRLDistributionPoints: []string{"https://tdxtest.invalid/pck.crl"},
		ExtraExtensions: []pkix.Extension{{Id: pcs.OidSgxExtension, Value: s.sgxExtension()}}}, s.Inter, s.interKey, s.pckKey)
	q, err := abi.QuoteToProto(testdata.RawQuote[:4935])
	if err != nil {
		t.Fatal(err)
	}
	s.template = q.(*pb.QuoteV4)
	s.template.ExtraBytes = nil
	return s
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func name(cn string) pkix.Name {
	return pkix.Name{CommonName: cn, Organization: []string{"Intel Corporation"}, Locality: []string{"Santa Clara"},
		Province: []string{"CA"}, Country: []string{"US"}}
}

// serial numbers certificates uniquely across signers (tests may run in
// parallel).
var serial atomic.Int64

func (s *Signer) cert(tmpl, parent *x509.Certificate, parentKey, key *ecdsa.PrivateKey) *x509.Certificate {
	s.t.Helper()
	tmpl.SerialNumber = big.NewInt(serial.Add(1))
	tmpl.NotBefore, tmpl.NotAfter = s.NotBefore, s.NotAfter
	tmpl.BasicConstraintsValid = true
	tmpl.SignatureAlgorithm = x509.ECDSAWithSHA256
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		s.t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

type oidOctets struct {
	ID asn1.ObjectIdentifier
	V  []byte
}

type oidInt struct {
	ID asn1.ObjectIdentifier
	V  int
}

type oidSeq struct {
	ID asn1.ObjectIdentifier
	V  []asn1.RawValue
}

// sgxExtension is the SGX extension of a PCK certificate: PPID, TCB
// (16 component SVNs, PCESVN, CPUSVN), PCEID, FMSPC.
func (s *Signer) sgxExtension() []byte {
	must := func(b []byte, err error) asn1.RawValue {
		if err != nil {
			s.t.Fatal(err)
		}
		return asn1.RawValue{FullBytes: b}
	}
	var tcb []asn1.RawValue
	for i, svn := range s.CPUSVN {
		tcb = append(tcb, must(asn1.Marshal(oidInt{append(append(asn1.ObjectIdentifier{}, pcs.OidTCB...), i+1), int(svn)})))
	}
	tcb = append(tcb, must(asn1.Marshal(oidInt{pcs.OidPCESvn, s.PCESVN})), must(asn1.Marshal(oidOctets{pcs.OidCPUSvn, s.CPUSVN})))
	fmspc, _ := hex.DecodeString(FMSPC)
	ext := []asn1.RawValue{
		must(asn1.Marshal(oidOctets{pcs.OidPPID, s.PPID})),
		must(asn1.Marshal(oidSeq{pcs.OidTCB, tcb})),
		must(asn1.Marshal(oidOctets{pcs.OidPCEID, []byte{0, 0}})),
		must(asn1.Marshal(oidOctets{pcs.OidFMSPC, fmspc})),
	}
	b, err := asn1.Marshal(ext)
	if err != nil {
		s.t.Fatal(err)
	}
	return b
}

// RootPEM is the fake root for a policy's trustedRoots.
func (s *Signer) RootPEM() string { return string(pemOf(s.Root)) }

func pemOf(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// Body returns the TD quote body the signer's quotes start from: the one
// of go-tdx-guest's recorded quote, for edits.
func (s *Signer) Body() *pb.TDQuoteBody {
	return proto.Clone(s.template.GetTdQuoteBody()).(*pb.TDQuoteBody)
}

// SetRTMRs makes rtmrs the RTMRs of Body() and of the quote provider's
// quotes (a TD whose boot a synthesized CC event log describes).
func (s *Signer) SetRTMRs(rtmrs [][]byte) {
	s.template.TdQuoteBody.Rtmrs = rtmrs
}

// Quote signs a quote of body (Body() edited) with REPORTDATA rd.
func (s *Signer) Quote(body *pb.TDQuoteBody, rd [64]byte) []byte {
	s.t.Helper()
	q := proto.Clone(s.template).(*pb.QuoteV4)
	q.TdQuoteBody = proto.Clone(body).(*pb.TDQuoteBody)
	q.TdQuoteBody.ReportData = rd[:]
	sd := q.GetSignedData()
	pub := s.attestKey.PublicKey
	ak := append(pad32(pub.X.Bytes()), pad32(pub.Y.Bytes())...)
	sd.EcdsaAttestationKey = ak
	qe := sd.GetCertificationData().GetQeReportCertificationData()
	h := sha256.Sum256(append(append([]byte{}, ak...), qe.GetQeAuthData().GetData()...))
	qe.QeReport.ReportData = append(h[:], make([]byte, 32)...)
	qeRaw, err := abi.EnclaveReportToAbiBytes(qe.GetQeReport())
	if err != nil {
		s.t.Fatal(err)
	}
	qe.QeReportSignature = s.sign(s.pckKey, qeRaw)
	chain := pemOf(s.PCK, s.Inter, s.Root)
	pck := qe.GetPckCertificateChainData()
	delta := uint32(len(chain)) - pck.GetSize()
	pck.PckCertChain, pck.Size = chain, uint32(len(chain))
	sd.CertificationData.Size += delta
	q.SignedDataSize += delta
	hdr, err := abi.HeaderToAbiBytes(q.GetHeader())
	if err != nil {
		s.t.Fatal(err)
	}
	b, err := abi.TdQuoteBodyToAbiBytes(q.GetTdQuoteBody())
	if err != nil {
		s.t.Fatal(err)
	}
	sd.Signature = s.sign(s.attestKey, append(hdr, b...))
	raw, err := abi.QuoteToAbiBytes(q)
	if err != nil {
		s.t.Fatal(err)
	}
	return raw
}

func pad32(b []byte) []byte { return append(make([]byte, 32-len(b)), b...) }

// sign is Intel's signature format: r||s, 32 bytes each, over SHA-256.
func (s *Signer) sign(k *ecdsa.PrivateKey, msg []byte) []byte {
	d := sha256.Sum256(msg)
	r, ss, err := ecdsa.Sign(rand.Reader, k, d[:])
	if err != nil {
		s.t.Fatal(err)
	}
	return append(pad32(r.Bytes()), pad32(ss.Bytes())...)
}

// Collateral says what the signer's PCS serves.
type Collateral struct {
	// TCBStatus is the status of the one TCB level, which the signer's
	// PCK TCB and the recorded body's TEE_TCB_SVN meet (default UpToDate).
	TCBStatus string
	// QEStatus is the QE identity's level status (default UpToDate).
	QEStatus string
	// IssueDate and NextUpdate bound the TCB info, QE identity and CRLs.
	IssueDate, NextUpdate time.Time
	// RevokePCK, RevokeInter and RevokeTCBSigner list the PCK certificate
	// in the PCK CRL, the PCK CA and the TCB signing certificate in the
	// root CRL.
	RevokePCK, RevokeInter, RevokeTCBSigner bool
}

// Getter serves c as Intel PCS would, for FetchCollateral.
func (s *Signer) Getter(c Collateral) *tdxtesting.Getter {
	s.t.Helper()
	if c.TCBStatus == "" {
		c.TCBStatus = "UpToDate"
	}
	if c.QEStatus == "" {
		c.QEStatus = "UpToDate"
	}
	chain := url.QueryEscape(string(pemOf(s.TCBSign, s.Root)))
	qe := s.template.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReport()
	body := s.template.GetTdQuoteBody()
	comps := func(svns []byte) []map[string]any {
		var out []map[string]any
		for _, v := range svns {
			out = append(out, map[string]any{"svn": v})
		}
		return out
	}
	date := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	tcbInfo := map[string]any{
		"id": "TDX", "version": 3, "issueDate": date(c.IssueDate), "nextUpdate": date(c.NextUpdate),
		"fmspc": FMSPC, "pceId": "0000", "tcbType": 0, "tcbEvaluationDataNumber": 17,
		"tdxModule": map[string]any{"mrsigner": hex.EncodeToString(body.GetMrSignerSeam()), "attributes": "0000000000000000", "attributesMask": "FFFFFFFFFFFFFFFF"},
		"tcbLevels": []map[string]any{{
			"tcb":       map[string]any{"sgxtcbcomponents": comps(s.CPUSVN), "pcesvn": s.PCESVN, "tdxtcbcomponents": comps(body.GetTeeTcbSvn())},
			"tcbDate":   "2023-02-15T00:00:00Z",
			"tcbStatus": c.TCBStatus,
		}},
	}
	qeID := map[string]any{
		"id": "TD_QE", "version": 2, "issueDate": date(c.IssueDate), "nextUpdate": date(c.NextUpdate), "tcbEvaluationDataNumber": 17,
		"miscselect": "00000000", "miscselectMask": "FFFFFFFF",
		"attributes": "11000000000000000000000000000000", "attributesMask": "FBFFFFFFFFFFFFFF0000000000000000",
		"mrsigner": hex.EncodeToString(qe.GetMrSigner()), "isvprodid": qe.GetIsvProdId(),
		"tcbLevels": []map[string]any{{"tcb": map[string]any{"isvsvn": qe.GetIsvSvn()}, "tcbDate": "2023-02-15T00:00:00Z", "tcbStatus": c.QEStatus}},
	}
	var pckRevoked, rootRevoked []x509.RevocationListEntry
	if c.RevokePCK {
		pckRevoked = append(pckRevoked, x509.RevocationListEntry{SerialNumber: s.PCK.SerialNumber, RevocationTime: c.IssueDate})
	}
	if c.RevokeInter {
		rootRevoked = append(rootRevoked, x509.RevocationListEntry{SerialNumber: s.Inter.SerialNumber, RevocationTime: c.IssueDate})
	}
	if c.RevokeTCBSigner {
		rootRevoked = append(rootRevoked, x509.RevocationListEntry{SerialNumber: s.TCBSign.SerialNumber, RevocationTime: c.IssueDate})
	}
	return &tdxtesting.Getter{Responses: map[string]tdxtesting.HTTPResponse{
		pcs.TcbInfoURL(FMSPC): {Header: map[string][]string{pcs.TcbInfoIssuerChainPhrase: {chain}}, Body: s.signedJSON("tcbInfo", tcbInfo)},
		pcs.QeIdentityURL():   {Header: map[string][]string{pcs.SgxQeIdentityIssuerChainPhrase: {chain}}, Body: s.signedJSON("enclaveIdentity", qeID)},
		pcs.PckCrlURL("platform"): {Header: map[string][]string{pcs.SgxPckCrlIssuerChainPhrase: {url.QueryEscape(string(pemOf(s.Inter, s.Root)))}},
			Body: s.crl(s.Inter, s.interKey, pckRevoked, c)},
		RootCRLURL: {Body: s.crl(s.Root, s.rootKey, rootRevoked, c)},
	}}
}

func (s *Signer) signedJSON(field string, v any) []byte {
	raw, err := json.Marshal(v)
	if err != nil {
		s.t.Fatal(err)
	}
	sig := hex.EncodeToString(s.sign(s.tcbKey, raw))
	return []byte(`{"` + field + `":` + string(raw) + `,"signature":"` + sig + `"}`)
}

func (s *Signer) crl(issuer *x509.Certificate, key *ecdsa.PrivateKey, revoked []x509.RevocationListEntry, c Collateral) []byte {
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: c.IssueDate,
		NextUpdate: c.NextUpdate, RevokedCertificateEntries: revoked}, issuer, key)
	if err != nil {
		s.t.Fatal(err)
	}
	return der
}

// QuoteProvider is a go-tdx-guest client.QuoteProvider that signs a quote
// of Body() for whatever REPORTDATA it is asked, padded as the kernel's
// buffer is: the issuer's provider in tests of an assembled agent.
type QuoteProvider struct{ s *Signer }

// QuoteProvider returns the signer's quote provider.
func (s *Signer) QuoteProvider() *QuoteProvider { return &QuoteProvider{s: s} }

// IsSupported is always nil.
func (p *QuoteProvider) IsSupported() error { return nil }

// GetRawQuote signs a quote with REPORTDATA rd, zero-padded to 8000 bytes.
func (p *QuoteProvider) GetRawQuote(rd [64]byte) ([]uint8, error) {
	q := p.s.Quote(p.s.Body(), rd)
	return append(q, make([]byte, 8000-len(q))...), nil
}
