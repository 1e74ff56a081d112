package issuer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"reflect"
	"testing"

	"github.com/google/go-sev-guest/abi"
	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/issuer"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/attest/snp/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func TestIssuerEvidenceValidates(t *testing.T) {
	s := snptest.New(t)
	iss := s.Issuer()
	defer iss.Close()
	if iss.Variant() != latchkeyv1.Variant_VARIANT_SNP {
		t.Errorf("Variant = %v", iss.Variant())
	}
	binding := newBinding(t)
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		t.Fatalf("Attest: %v", err)
	}
	defer a.Close()
	ev, err := wire.DecodeEvidence(a.Evidence())
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.CertTable) == 0 || ev.Endorsement == nil {
		t.Error("evidence lacks the host's certificate table")
	}
	v := newValidator(t, s.Policy(), nil)
	if _, err := attest.Validate(context.Background(), v, a.Evidence(), binding, nil); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if _, err := a.Respond(context.Background(), []byte("challenge")); err == nil {
		t.Error("Respond answered a challenge; SNP takes none")
	}
	if _, err := iss.Attest(context.Background(), binding[:16]); err == nil {
		t.Error("Attest accepted a 16-byte binding")
	}
}

// TestIssuerWithGoSevGuestTestProvider gets the report through
// go-sev-guest's own test quote provider.
func TestIssuerWithGoSevGuestTestProvider(t *testing.T) {
	s := snptest.New(t)
	binding := newBinding(t)
	var data [64]byte
	copy(data[:], binding)
	iss, err := issuer.New(issuer.Config{QuoteProvider: s.TcQuoteProvider(data)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		t.Fatalf("Attest: %v", err)
	}
	v := newValidator(t, s.Policy(), nil)
	if _, err := attest.Validate(context.Background(), v, a.Evidence(), binding, nil); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	// The provider has no report for another binding.
	if _, err := iss.Attest(context.Background(), newBinding(t)); err == nil {
		t.Error("Attest succeeded for a binding the provider has no report for")
	}
}

func TestIssuerVMPL(t *testing.T) {
	s := snptest.New(t)
	vmpl := uint(1)
	iss, err := issuer.New(issuer.Config{QuoteProvider: s.QuoteProvider(), VMPL: &vmpl})
	if err != nil {
		t.Fatal(err)
	}
	binding := newBinding(t)
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Policy()
	if _, err := attest.Validate(context.Background(), newValidator(t, p, nil), a.Evidence(), binding, nil); attest.ReasonOf(err) != latchkeyv1.Reason_VMPL_MISMATCH {
		t.Errorf("VMPL 1 report against vmpls [0] = %v, want VMPL_MISMATCH", err)
	}
	p.VMPLs = []uint32{0, 1}
	if _, err := attest.Validate(context.Background(), newValidator(t, p, nil), a.Evidence(), binding, nil); err != nil {
		t.Errorf("VMPL 1 report against vmpls [0, 1]: %v", err)
	}
	bad := uint(4)
	if _, err := issuer.New(issuer.Config{QuoteProvider: s.QuoteProvider(), VMPL: &bad}); err == nil {
		t.Error("New accepted VMPL 4")
	}
}

func TestAvailableMatchesNew(t *testing.T) {
	_, err := issuer.New(issuer.Config{})
	if got := issuer.Available(); got != (err == nil) {
		t.Errorf("Available() = %v but New with the platform provider: %v", got, err)
	}
}

// TestMeasurePolicyAcceptsTheGuest captures a golden policy from one
// "boot" and checks that it accepts that guest's evidence, survives a
// YAML round trip, and names what it should.
func TestMeasurePolicyAcceptsTheGuest(t *testing.T) {
	hostData := make([]byte, abi.HostDataSize)
	hostData[0] = 0x42
	s := snptest.NewWithOptions(t, snptest.Options{
		GuestSVN: 3, PlatformInfo: 1, HostData: hostData,
		GuestPolicy: abi.SnpPolicy{SMT: true, MigrateMA: true},
	})
	p, err := issuer.Measure(context.Background(), issuer.Config{QuoteProvider: s.QuoteProvider()})
	if err != nil {
		t.Fatalf("Measure: %v", err)
	}
	want := wire.Policy{
		Measurements:        []string{hex.EncodeToString(snptest.DefaultMeasurement)},
		MinimumTCB:          wire.TCBFromVersion(s.TCB()),
		MinimumGuestSVN:     3,
		AllowMigrationAgent: true,
		SMT:                 wire.SMTAllowed,
		VMPLs:               []uint32{0},
		HostData:            []string{hex.EncodeToString(hostData)},
	}
	if !reflect.DeepEqual(*p, want) {
		t.Fatalf("Measure = %+v\nwant      %+v", *p, want)
	}
	y, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back wire.Policy
	if err := yaml.UnmarshalStrict(y, &back); err != nil || !reflect.DeepEqual(back, *p) {
		t.Fatalf("YAML round trip: %v\n%s", err, y)
	}
	back.TrustedRoots = s.TrustedRoots()
	binding := newBinding(t)
	if _, err := attest.Validate(context.Background(), newValidator(t, back, nil), s.Evidence(binding), binding, nil); err != nil {
		t.Fatalf("measured policy refuses its own guest: %v", err)
	}
}

func newBinding(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, attest.BindingSize)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// newValidator is the verifier's half, which judges what the issuer made.
func newValidator(t testing.TB, p wire.Policy, c *snp.Collateral) *snp.Validator {
	t.Helper()
	v, err := snp.NewValidator(p, c)
	if err != nil {
		t.Fatalf("NewValidator: %v", err)
	}
	return v
}
