package offline

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"math/big"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

func testSecret(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func testRequest() GrantRequest {
	return GrantRequest{
		PolicyRef:  PolicyRef([]byte("machine"), "disk-uuid"),
		PCRs:       map[uint32][]byte{7: bytes.Repeat([]byte{7}, 32), 11: bytes.Repeat([]byte{11}, 32)},
		ResetCount: 5,
		ClockMS:    1000,
		MaxBoots:   3,
		MaxHours:   24,
	}
}

func testAuthorizer(t testing.TB, secret []byte) *Authorizer {
	t.Helper()
	key, err := DeriveGrantKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAuthorizer(key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestDeriveGrantKeyIsDeterministicPerSecret(t *testing.T) {
	k1, err := DeriveGrantKey(testSecret(1))
	if err != nil {
		t.Fatal(err)
	}
	k1again, _ := DeriveGrantKey(testSecret(1))
	k2, _ := DeriveGrantKey(testSecret(2))
	if !k1.Equal(k1again) {
		t.Error("the same secret derived two keys")
	}
	if k1.Equal(k2) {
		t.Error("two secrets derived one key")
	}
	if k1.Curve != elliptic.P256() {
		t.Errorf("curve %v, want P-256", k1.Curve.Params().Name)
	}
}

func TestDeriveGrantKeyRefusesShortSecret(t *testing.T) {
	_, err := DeriveGrantKey(make([]byte, 31))
	if err == nil || !strings.Contains(err.Error(), "master secret is 31 bytes, want at least 32") {
		t.Fatalf("err = %v", err)
	}
}

func TestPolicyRefSeparatesParts(t *testing.T) {
	a := PolicyRef([]byte("ab"), "c")
	b := PolicyRef([]byte("a"), "bc")
	if bytes.Equal(a, b) {
		t.Error("moving a byte between machine ID and disk UUID kept the policy ref")
	}
	if len(a) != MaxPolicyRef {
		t.Errorf("policy ref is %d bytes, want %d", len(a), MaxPolicyRef)
	}
	if !bytes.Equal(a, PolicyRef([]byte("ab"), "c")) {
		t.Error("policy ref is not deterministic")
	}
}

func TestNewAuthorizerRefusesOtherKeys(t *testing.T) {
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 1024)
	for name, k := range map[string]crypto.Signer{"P-384": p384, "RSA": rsaKey} {
		if _, err := NewAuthorizer(k); err == nil || !strings.Contains(err.Error(), "must be ECDSA P-256") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// TestGrantSignatureVerifies checks the grant's signature with the Go
// verifier over the documented preimage; the swtpm tests check that a TPM
// accepts it.
func TestGrantSignatureVerifies(t *testing.T) {
	key, _ := DeriveGrantKey(testSecret(1))
	a, _ := NewAuthorizer(key)
	req := testRequest()
	g, err := a.Grant(req)
	if err != nil {
		t.Fatal(err)
	}
	req2, _, name, sig, err := checkGrant(g)
	if err != nil {
		t.Fatalf("a fresh grant does not pass its own checks: %v", err)
	}
	ecc, _ := sig.Signature.ECDSA()
	digest := sha256.Sum256(append(approvedPolicy(req2), req2.PolicyRef...))
	r := new(big.Int).SetBytes(ecc.SignatureR.Buffer)
	s := new(big.Int).SetBytes(ecc.SignatureS.Buffer)
	if !ecdsa.Verify(&key.PublicKey, digest[:], r, s) {
		t.Error("signature does not verify over SHA-256(approvedPolicy || policyRef)")
	}
	pub, _ := signerTemplate(&key.PublicKey)
	want, _ := tpm2.ObjectName(&pub)
	if !bytes.Equal(name, want.Buffer) {
		t.Error("signer name differs from the key's")
	}
}

// TestSealPolicyMatchesGoTPM cross-checks the hand-written policy digests
// with go-tpm's calculator for the commands it knows (it has no
// PolicyCounterTimer; the swtpm tests check that part against a TPM).
func TestSealPolicyMatchesGoTPM(t *testing.T) {
	signer := bytes.Repeat([]byte{1}, 34)
	ref := PolicyRef([]byte("m"), "d")
	nvName, err := counterName(GrantCounterIndex)
	if err != nil {
		t.Fatal(err)
	}
	calc, _ := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err := (tpm2.PolicyAuthorize{KeySign: tpm2.TPM2BName{Buffer: signer}, PolicyRef: tpm2.TPM2BDigest{Buffer: ref}}).Update(calc); err != nil {
		t.Fatal(err)
	}
	nv := tpm2.NamedHandle{Handle: tpm2.TPMHandle(GrantCounterIndex), Name: tpm2.TPM2BName{Buffer: nvName}}
	if err := (tpm2.PolicyNV{NVIndex: nv, OperandB: tpm2.TPM2BOperand{Buffer: counterOperand(9)}, Operation: tpm2.TPMEOEq}).Update(calc); err != nil {
		t.Fatal(err)
	}
	if got := sealPolicy(signer, ref, nvName, 9); !bytes.Equal(got, calc.Hash().Digest) {
		t.Errorf("seal policy %x, go-tpm %x", got, calc.Hash().Digest)
	}

	req := testRequest()
	calc.Reset()
	if err := (tpm2.PolicyPCR{Pcrs: pcrSelection(req.PCRs), PcrDigest: tpm2.TPM2BDigest{Buffer: pcrDigest(req.PCRs)}}).Update(calc); err != nil {
		t.Fatal(err)
	}
	if got := extend(make([]byte, 32), tpm2.TPMCCPolicyPCR, tpm2.Marshal(pcrSelection(req.PCRs)), pcrDigest(req.PCRs)); !bytes.Equal(got, calc.Hash().Digest) {
		t.Errorf("PolicyPCR %x, go-tpm %x", got, calc.Hash().Digest)
	}
}

func TestGrantRefusesBadRequests(t *testing.T) {
	a := testAuthorizer(t, testSecret(1))
	for _, tc := range []struct {
		name string
		edit func(*GrantRequest)
		want string
	}{
		{"empty policy ref", func(r *GrantRequest) { r.PolicyRef = nil }, "policy ref is 0 bytes"},
		{"long policy ref", func(r *GrantRequest) { r.PolicyRef = make([]byte, 33) }, "policy ref is 33 bytes"},
		{"no PCRs", func(r *GrantRequest) { r.PCRs = nil }, "no PCR values"},
		{"PCR 24", func(r *GrantRequest) { r.PCRs[24] = make([]byte, 32) }, "PCR 24 out of range"},
		{"short PCR value", func(r *GrantRequest) { r.PCRs[7] = make([]byte, 20) }, "PCR 7 value is 20 bytes"},
		{"zero boots", func(r *GrantRequest) { r.MaxBoots = 0 }, "max boots 0 outside"},
		{"too many boots", func(r *GrantRequest) { r.MaxBoots = MaxBootsLimit + 1 }, "max boots 1001 outside"},
		{"zero hours", func(r *GrantRequest) { r.MaxHours = 0 }, "max hours 0 outside"},
		{"too many hours", func(r *GrantRequest) { r.MaxHours = MaxHoursLimit + 1 }, "max hours 8761 outside"},
		{"reset count overflow", func(r *GrantRequest) { r.ResetCount = 1<<32 - 2 }, "overflows"},
		{"clock overflow", func(r *GrantRequest) { r.ClockMS = 1<<64 - 5 }, "overflows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := testRequest()
			tc.edit(&req)
			g, err := a.Grant(req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("grant = %v, err = %v, want %q", g, err, tc.want)
			}
		})
	}
}

// TestCheckGrantRefusesEditedEncodings edits the two opaque fields of a
// grant (what an attacker on the disk controls) and keeps the rest.
func TestCheckGrantRefusesEditedEncodings(t *testing.T) {
	a := testAuthorizer(t, testSecret(1))
	g, err := a.Grant(testRequest())
	if err != nil {
		t.Fatal(err)
	}
	rsaPub := tpm2.Marshal(tpm2.RSASRKTemplate)
	for _, tc := range []struct {
		name      string
		pub, sig  []byte
		wantError string
	}{
		{"signer trailing byte", append(bytes.Clone(g.SignerPublic), 0), g.Signature, "not an ECDSA SHA-256 P-256 signing key in canonical form"},
		{"signer RSA", rsaPub, g.Signature, "not an ECC key"},
		{"signer empty", nil, g.Signature, "signer public is 0 bytes"},
		{"signature trailing byte", g.SignerPublic, append(bytes.Clone(g.Signature), 0), "not in canonical form"},
		{"signature empty", g.SignerPublic, nil, "signature is 0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := cloneGrant(g)
			e.SignerPublic, e.Signature = tc.pub, tc.sig
			if _, _, _, _, err := checkGrant(e); err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Fatalf("err = %v, want %q", err, tc.wantError)
			}
		})
	}
}
