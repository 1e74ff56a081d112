package snp_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	test "github.com/google/go-sev-guest/testing"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	snpwire "github.com/latchkey/latchkey/attest/snp/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func newBinding(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, attest.BindingSize)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func newValidator(t testing.TB, p snp.Policy, c *snp.Collateral) *snp.Validator {
	t.Helper()
	v, err := snp.NewValidator(p, c)
	if err != nil {
		t.Fatalf("NewValidator: %v", err)
	}
	return v
}

func TestValidateAcceptsVCEKReport(t *testing.T) {
	s := snptest.New(t)
	v := newValidator(t, s.Policy(), nil)
	binding := newBinding(t)
	evidence := s.Evidence(binding)

	got, err := attest.Validate(context.Background(), v, evidence, binding, nil)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if got.Variant != latchkeyv1.Variant_VARIANT_SNP {
		t.Errorf("Variant = %v", got.Variant)
	}
	if got.EvidenceDigest != attest.EvidenceDigest(evidence) {
		t.Error("EvidenceDigest does not hash the evidence")
	}
	if want := "chip:" + hex.EncodeToString(snptest.DefaultChipID[:8]); got.Identity != want {
		t.Errorf("Identity = %q, want %q", got.Identity, want)
	}
	st, ok := got.State.(*snp.State)
	if !ok {
		t.Fatalf("State is %T, want *snp.State", got.State)
	}
	if !bytes.Equal(st.Measurement, snptest.DefaultMeasurement) || st.ProductLine != "Milan" ||
		st.SigningKey != "VCEK" || st.ReportedTCBVersion != s.TCB() || st.VMPL != 0 {
		t.Errorf("State = %+v", st)
	}
	if st.ReportedTCB != snpwire.TCBFromVersion(s.TCB()) {
		t.Errorf("ReportedTCB = %+v", st.ReportedTCB)
	}
}

func TestValidateAcceptsVLEKReport(t *testing.T) {
	s := snptest.NewWithOptions(t, snptest.Options{VLEK: true, ProductLine: "Genoa"})
	v := newValidator(t, s.Policy(), nil)
	binding := newBinding(t)
	got, err := attest.Validate(context.Background(), v, s.Evidence(binding), binding, nil)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if st := got.State.(*snp.State); st.SigningKey != "VLEK" || st.ProductLine != "Genoa" {
		t.Errorf("State = %+v", st)
	}
}

// TestValidateRepeatUsesCacheAndStillChecks validates reports of one chip
// several times: after the first, the chain is cached, and every check
// after it still runs.
func TestValidateRepeatUsesCacheAndStillChecks(t *testing.T) {
	s := snptest.New(t)
	v := newValidator(t, s.Policy(), nil)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		binding := newBinding(t)
		if _, err := attest.Validate(ctx, v, s.Evidence(binding), binding, nil); err != nil {
			t.Fatalf("Validate #%d: %v", i, err)
		}
	}
	binding := newBinding(t)
	if _, err := attest.Validate(ctx, v, s.Evidence(binding), newBinding(t), nil); attest.ReasonOf(err) != latchkeyv1.Reason_BINDING_MISMATCH {
		t.Errorf("other binding after warm cache: %v", err)
	}
	raw := s.Report(binding)
	signForeign(t, raw)
	ev, _ := snpwire.EncodeEvidence(raw, s.CertTable())
	if _, err := attest.Validate(ctx, v, ev, binding, nil); attest.ReasonOf(err) != latchkeyv1.Reason_BAD_SIGNATURE {
		t.Errorf("foreign signature after warm cache: %v", err)
	}
}

func signForeign(t testing.TB, raw []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := snptest.SignRawWith(raw, key); err != nil {
		t.Fatal(err)
	}
}

type refusalCase struct {
	name   string
	signer snptest.Options
	policy func(*snp.Policy)
	// evidence builds the evidence; nil means s.Evidence(binding).
	evidence func(t *testing.T, s *snptest.Signer, binding []byte) []byte
	want     latchkeyv1.Reason
	detail   string
}

func editEvidence(edits ...snptest.Edit) func(*testing.T, *snptest.Signer, []byte) []byte {
	return func(t *testing.T, s *snptest.Signer, binding []byte) []byte { return s.Evidence(binding, edits...) }
}

// rawEvidence encodes report and table as SNPEvidence without any size
// check, so tests can send malformed reports.
func rawEvidence(report, table []byte) []byte {
	b, err := proto.Marshal(&latchkeyv1.SNPEvidence{Report: report, CertificateTable: table})
	if err != nil {
		panic(err)
	}
	return b
}

func TestValidateRefuses(t *testing.T) {
	cases := []refusalCase{
		{
			name: "truncated report",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				return rawEvidence(s.Report(b)[:abi.ReportSize-1], s.CertTable())
			},
			want: latchkeyv1.Reason_MALFORMED, detail: "truncated",
		},
		{
			name: "oversized report",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				return rawEvidence(append(s.Report(b), 0), s.CertTable())
			},
			want: latchkeyv1.Reason_MALFORMED, detail: "oversized",
		},
		{
			name: "certificate table entry outside the table",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				table := s.CertTable()
				binary.LittleEndian.PutUint32(table[16:20], 0xffffff00) // offset of entry 0
				binary.LittleEndian.PutUint32(table[20:24], 0x200)      // length: overflows 32 bits
				return rawEvidence(s.Report(b), table)
			},
			want: latchkeyv1.Reason_MALFORMED, detail: "outside",
		},
		{
			name:     "missing VCEK",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte { return s.EvidenceWithoutTable(b) },
			want:     latchkeyv1.Reason_COLLATERAL_MISSING,
			detail:   hex.EncodeToString(snptest.DefaultChipID),
		},
		{
			name:   "ARK not trusted (AMD's own roots)",
			policy: func(p *snp.Policy) { p.TrustedRoots = nil },
			want:   latchkeyv1.Reason_UNTRUSTED_CHAIN,
		},
		{
			name:   "ARK not trusted (another fake chain)",
			policy: func(p *snp.Policy) { p.TrustedRoots = otherRootChain(t).TrustedRoots() },
			want:   latchkeyv1.Reason_UNTRUSTED_CHAIN,
		},
		{
			name:   "untrusted chain and bad signature reports the chain",
			policy: func(p *snp.Policy) { p.TrustedRoots = nil },
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				raw := s.Report(b)
				signForeign(t, raw)
				return rawEvidence(raw, s.CertTable())
			},
			want: latchkeyv1.Reason_UNTRUSTED_CHAIN,
		},
		{
			name: "VCEK of another chip",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				o := snptest.NewWithOptions(t, snptest.Options{ChipID: bytes.Repeat([]byte{7}, abi.ChipIDSize)})
				return rawEvidence(s.Report(b), o.CertTable())
			},
			want: latchkeyv1.Reason_UNTRUSTED_CHAIN, detail: "issued for chip",
		},
		{
			name:     "REPORTED_TCB differs from the VCEK's",
			evidence: editEvidence(func(r *spb.Report) { r.ReportedTcb++ }),
			want:     latchkeyv1.Reason_UNTRUSTED_CHAIN, detail: "REPORTED_TCB",
		},
		{
			name: "report signed by a key outside the chain",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				raw := s.Report(b)
				signForeign(t, raw)
				return rawEvidence(raw, s.CertTable())
			},
			want: latchkeyv1.Reason_BAD_SIGNATURE,
		},
		{
			name: "report edited after signing",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				raw := s.Report(b)
				raw[0x90] ^= 1 // measurement
				return rawEvidence(raw, s.CertTable())
			},
			want: latchkeyv1.Reason_BAD_SIGNATURE,
		},
		{
			// A first join verifies the signature over the report as
			// re-encoded from its parsed form, which keeps 4 bits of the
			// CPUID stepping: this edit re-encodes to the bytes the chip
			// signed, so only the check of the received bytes refuses it.
			name: "report edited after signing where its parsed form drops the edit",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				raw := s.Report(b)
				raw[0x18a] ^= 0x10 // CPUID_STEP's high nibble
				return rawEvidence(raw, s.CertTable())
			},
			want: latchkeyv1.Reason_BAD_SIGNATURE,
		},
		{
			name: "REPORT_DATA from another binding",
			evidence: func(t *testing.T, s *snptest.Signer, b []byte) []byte {
				return s.Evidence(newBinding(t))
			},
			want: latchkeyv1.Reason_BINDING_MISMATCH,
		},
		{
			name:     "REPORT_DATA second half not zero",
			evidence: editEvidence(func(r *spb.Report) { r.ReportData[63] = 1 }),
			want:     latchkeyv1.Reason_BINDING_MISMATCH,
		},
		{
			name:   "wrong measurement",
			policy: func(p *snp.Policy) { p.Measurements = []string{strings.Repeat("ab", abi.MeasurementSize)} },
			want:   latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED,
		},
		{
			name:   "no measurement listed",
			policy: func(p *snp.Policy) { p.Measurements = nil },
			want:   latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED,
		},
		{
			name:   "debug bit",
			signer: snptest.Options{GuestPolicy: abi.SnpPolicy{Debug: true}},
			want:   latchkeyv1.Reason_DEBUG_POLICY,
		},
		{
			name:     "migration agent",
			evidence: editEvidence(setPolicy(abi.SnpPolicy{MigrateMA: true})),
			want:     latchkeyv1.Reason_GUEST_POLICY_MISMATCH, detail: "migration agent",
		},
		{
			name:     "CXL allowed",
			evidence: editEvidence(setPolicy(abi.SnpPolicy{CXLAllowed: true})),
			want:     latchkeyv1.Reason_GUEST_POLICY_MISMATCH, detail: "CXL",
		},
		{
			name:     "SMT enabled on the host",
			evidence: editEvidence(func(r *spb.Report) { r.PlatformInfo |= 1 }),
			want:     latchkeyv1.Reason_GUEST_POLICY_MISMATCH, detail: "SMT",
		},
		{
			name:   "host data not listed",
			policy: func(p *snp.Policy) { p.HostData = []string{strings.Repeat("01", abi.HostDataSize)} },
			want:   latchkeyv1.Reason_GUEST_POLICY_MISMATCH, detail: "HOST_DATA",
		},
		{
			name:   "ID key digest not listed",
			policy: func(p *snp.Policy) { p.IDKeyDigests = []string{strings.Repeat("02", abi.IDKeyDigestSize)} },
			want:   latchkeyv1.Reason_GUEST_POLICY_MISMATCH, detail: "ID_KEY_DIGEST",
		},
		{
			name: "author key listed but not enabled",
			policy: func(p *snp.Policy) {
				p.AuthorKeyDigests = []string{strings.Repeat("00", abi.AuthorKeyDigestSize)}
			},
			want: latchkeyv1.Reason_GUEST_POLICY_MISMATCH, detail: "AUTHOR_KEY_EN",
		},
		{
			name:     "wrong VMPL",
			evidence: editEvidence(func(r *spb.Report) { r.Vmpl = 2 }),
			want:     latchkeyv1.Reason_VMPL_MISMATCH,
		},
		{
			name:   "old TCB",
			policy: func(p *snp.Policy) { p.MinimumTCB.SNP = snptest.DefaultTCB.SnpSpl + 1 },
			want:   latchkeyv1.Reason_TCB_TOO_OLD,
		},
		{
			name:   "old microcode",
			policy: func(p *snp.Policy) { p.MinimumTCB.Microcode = snptest.DefaultTCB.UcodeSpl + 1 },
			want:   latchkeyv1.Reason_TCB_TOO_OLD,
		},
		{
			name:   "old guest SVN",
			policy: func(p *snp.Policy) { p.MinimumGuestSVN = 5 },
			want:   latchkeyv1.Reason_TCB_TOO_OLD,
		},
		{
			name:     "provisional firmware",
			evidence: editEvidence(func(r *spb.Report) { r.CommittedTcb-- }),
			want:     latchkeyv1.Reason_TCB_TOO_OLD,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { runRefusal(t, tc) })
	}
}

func runRefusal(t *testing.T, tc refusalCase) {
	s := snptest.NewWithOptions(t, tc.signer)
	p := s.Policy()
	if tc.policy != nil {
		tc.policy(&p)
	}
	v := newValidator(t, p, nil)
	binding := newBinding(t)
	evidence := s.Evidence(binding)
	if tc.evidence != nil {
		evidence = tc.evidence(t, s, binding)
	}
	got, err := attest.Validate(context.Background(), v, evidence, binding, nil)
	if got != nil {
		t.Errorf("Validate returned a result with error %v", err)
	}
	if r := attest.ReasonOf(err); r != tc.want {
		t.Fatalf("Validate reason = %v (%v), want %v", r, err, tc.want)
	}
	t.Logf("refusal: %v", err)
	if tc.detail != "" && !strings.Contains(err.Error(), tc.detail) {
		t.Errorf("refusal %q does not mention %q", err, tc.detail)
	}
}

func setPolicy(p abi.SnpPolicy) snptest.Edit {
	return func(r *spb.Report) { r.Policy = abi.SnpPolicyToBytes(p) }
}

// otherRootChain is a fake chain whose ARK key differs from the default's.
func otherRootChain(t *testing.T) *snptest.Signer {
	keys := test.DefaultAmdKeys()
	keys.Ark, keys.Ask = keys.Ask, keys.Ark
	return snptest.NewWithOptions(t, snptest.Options{Keys: keys})
}

func TestValidateRejectsBadBinding(t *testing.T) {
	s := snptest.New(t)
	v := newValidator(t, s.Policy(), nil)
	_, err := attest.Validate(context.Background(), v, s.Evidence(newBinding(t)), []byte("short"), nil)
	if err == nil || attest.ReasonOf(err) != latchkeyv1.Reason_INTERNAL {
		t.Errorf("Validate with a 5-byte binding = %v, want an INTERNAL error", err)
	}
}

func TestVCEKFileName(t *testing.T) {
	chip := bytes.Repeat([]byte{0xab}, abi.ChipIDSize)
	got := snp.VCEKFileName(chip, 0x7300000000000803)
	want := "vcek-" + strings.Repeat("ab", abi.ChipIDSize) + "-7300000000000803.der"
	if got != want {
		t.Errorf("VCEKFileName = %q, want %q", got, want)
	}
}

// Verify applies no reference value: a report whose measurement the
// policy does not list verifies, and CheckPolicy refuses its state.
func TestVerifyThenCheckPolicy(t *testing.T) {
	s := snptest.New(t)
	p := s.Policy()
	p.Measurements = []string{strings.Repeat("ab", abi.MeasurementSize)}
	v := newValidator(t, p, nil)
	binding := newBinding(t)
	ver, err := v.Verify(context.Background(), s.Evidence(binding), binding, nil)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	err = v.CheckPolicy(ver.State.(*snp.State))
	if r := attest.ReasonOf(err); r != latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED || !strings.Contains(err.Error(), "is not in the policy") {
		t.Fatalf("CheckPolicy: %v", err)
	}
	if _, err := v.Verify(context.Background(), s.Evidence(binding), newBinding(t), nil); attest.ReasonOf(err) != latchkeyv1.Reason_BINDING_MISMATCH {
		t.Fatalf("Verify with another binding: %v", err)
	}
}
