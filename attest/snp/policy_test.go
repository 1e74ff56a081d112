package snp_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func TestPolicyYAML(t *testing.T) {
	m := strings.Repeat("ab", 48)
	doc := `
measurements: ["` + m + `"]
minimumTCB: {bootloader: 3, tee: 0, snp: 8, microcode: 115}
minimumGuestSVN: 2
permitProvisionalFirmware: true
allowMigrationAgent: true
allowCXL: true
smt: allowed
vmpls: [0, 2]
idKeyDigests: ["` + strings.Repeat("01", 48) + `"]
authorKeyDigests: ["` + strings.Repeat("02", 48) + `"]
familyIDs: ["` + strings.Repeat("03", 16) + `"]
imageIDs: ["` + strings.Repeat("04", 16) + `"]
hostData: ["` + strings.Repeat("05", 32) + `"]
`
	var got snp.Policy
	if err := yaml.UnmarshalStrict([]byte(doc), &got); err != nil {
		t.Fatalf("UnmarshalStrict: %v", err)
	}
	want := snp.Policy{
		Measurements:              []string{m},
		MinimumTCB:                snp.TCB{Bootloader: 3, SNP: 8, Microcode: 115},
		MinimumGuestSVN:           2,
		PermitProvisionalFirmware: true,
		AllowMigrationAgent:       true,
		AllowCXL:                  true,
		SMT:                       snp.SMTAllowed,
		VMPLs:                     []uint32{0, 2},
		IDKeyDigests:              []string{strings.Repeat("01", 48)},
		AuthorKeyDigests:          []string{strings.Repeat("02", 48)},
		FamilyIDs:                 []string{strings.Repeat("03", 16)},
		ImageIDs:                  []string{strings.Repeat("04", 16)},
		HostData:                  []string{strings.Repeat("05", 32)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed %+v\nwant   %+v", got, want)
	}
	if _, err := snp.NewValidator(got, nil); err != nil {
		t.Errorf("NewValidator: %v", err)
	}
	if err := yaml.UnmarshalStrict([]byte("measurement: []\n"), &got); err == nil {
		t.Error("UnmarshalStrict accepted an unknown field")
	}
}

func TestNewValidatorRefusesBadPolicy(t *testing.T) {
	s := snptest.New(t)
	other := otherRootChain(t)
	ok := s.Policy()
	tests := map[string]func(p *snp.Policy){
		"measurement not hex":    func(p *snp.Policy) { p.Measurements = []string{"xyz"} },
		"measurement too short":  func(p *snp.Policy) { p.Measurements = []string{"abcd"} },
		"host data wrong length": func(p *snp.Policy) { p.HostData = []string{strings.Repeat("00", 48)} },
		"VMPL 4":                 func(p *snp.Policy) { p.VMPLs = []uint32{4} },
		"unknown smt mode":       func(p *snp.Policy) { p.SMT = "sometimes" },
		"TCB part over 127":      func(p *snp.Policy) { p.MinimumTCB.Bootloader = 200 },
		"root not PEM":           func(p *snp.Policy) { p.TrustedRoots = []snp.TrustedRoot{{ProductLine: "Milan", CertChain: "junk"}} },
		"unknown product line": func(p *snp.Policy) {
			p.TrustedRoots = []snp.TrustedRoot{{ProductLine: "Naples", CertChain: ok.TrustedRoots[0].CertChain}}
		},
		"ASK not signed by ARK": func(p *snp.Policy) {
			ask, _, _ := strings.Cut(ok.TrustedRoots[0].CertChain, "-----END CERTIFICATE-----\n")
			_, ark, _ := strings.Cut(other.TrustedRoots()[0].CertChain, "-----END CERTIFICATE-----\n")
			p.TrustedRoots = []snp.TrustedRoot{{ProductLine: "Milan", CertChain: ask + "-----END CERTIFICATE-----\n" + ark}}
		},
	}
	for name, edit := range tests {
		t.Run(name, func(t *testing.T) {
			p := s.Policy()
			edit(&p)
			if _, err := snp.NewValidator(p, nil); err == nil {
				t.Error("NewValidator accepted the policy")
			}
		})
	}
}

// TestZeroPolicyAcceptsNothing: with only the roots set (so the chain
// passes), the zero policy refuses a genuine, clean report.
func TestZeroPolicyAcceptsNothing(t *testing.T) {
	s := snptest.New(t)
	binding := newBinding(t)
	v := newValidator(t, snp.Policy{TrustedRoots: s.TrustedRoots()}, nil)
	_, err := attest.Validate(context.Background(), v, s.Evidence(binding), binding, nil)
	if attest.ReasonOf(err) != latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED {
		t.Errorf("zero policy: %v, want MEASUREMENT_NOT_ALLOWED", err)
	}
	// And the true zero value trusts only AMD's roots, not the fake chain.
	_, err = attest.Validate(context.Background(), newValidator(t, snp.Policy{}, nil), s.Evidence(binding), binding, nil)
	if attest.ReasonOf(err) != latchkeyv1.Reason_UNTRUSTED_CHAIN {
		t.Errorf("zero policy without roots: %v, want UNTRUSTED_CHAIN", err)
	}
}

// TestCachedChainExpires: a verified chain is not reused once its
// certificates expire.
func TestCachedChainExpires(t *testing.T) {
	s := snptest.New(t)
	now := time.Now()
	v, err := snp.NewValidator(s.Policy(), nil, snp.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	binding := newBinding(t)
	evidence := s.Evidence(binding)
	if _, err := attest.Validate(context.Background(), v, evidence, binding, nil); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	now = s.AMD.Vcek.NotAfter.Add(time.Hour)
	if _, err := attest.Validate(context.Background(), v, evidence, binding, nil); attest.ReasonOf(err) != latchkeyv1.Reason_UNTRUSTED_CHAIN {
		t.Errorf("Validate after the VCEK expired = %v, want UNTRUSTED_CHAIN", err)
	}
}
