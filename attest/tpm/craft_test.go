package tpm_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/pkitest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// crafted is evidence made in software, as an attacker without a TPM
// would: a software ECDSA key posing as the AK signs a hand-built quote.
type crafted struct {
	key      *ecdsa.PrivateKey
	akPublic []byte
	akHash   string
}

func newCrafted(t testing.TB, restricted bool) *crafted {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	return &crafted{key: k, akPublic: akPublicOf(k, restricted), akHash: "sha256:" + hex.EncodeToString(sum[:])}
}

// craftedAKPublic is the public area of a fresh software key.
func craftedAKPublic(t testing.TB, restricted bool) []byte {
	return newCrafted(t, restricted).akPublic
}

func akPublicOf(k *ecdsa.PrivateKey, restricted bool) []byte {
	raw, _ := k.PublicKey.Bytes() // 0x04 || X || Y
	return tpm2.Marshal(tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true,
			UserWithAuth: true, Restricted: restricted, SignEncrypt: true,
		},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme: tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgECDSA, Details: tpm2.NewTPMUAsymScheme(
				tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256})},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: raw[1:33]},
			Y: tpm2.TPM2BECCParameter{Buffer: raw[33:]},
		}),
	})
}

// evidence builds a quote of PCR 0 (all zeros) carrying binding, signed
// by the crafted key.
func (c *crafted) evidence(t testing.TB, binding []byte) []byte {
	return c.evidenceWith(t, binding, craftOpts{pcrs: map[int][32]byte{0: {}}})
}

// craftOpts is what a crafted quote covers and the logs it carries.
type craftOpts struct {
	pcrs        map[int][32]byte
	fw, sd, sig []byte
	clock       tpm2.TPMSClockInfo
}

// evidenceWith builds a quote of o.pcrs carrying binding, signed by the
// crafted key, with o's logs: what a TPM whose PCRs hold o.pcrs would
// produce.
func (c *crafted) evidenceWith(t testing.TB, binding []byte, o craftOpts) []byte {
	t.Helper()
	sel := make([]byte, 3)
	var concat []byte
	wire := map[uint32][]byte{}
	for _, idx := range tpmtest.Indices(o.pcrs) {
		v := o.pcrs[idx]
		sel[idx/8] |= 1 << (idx % 8)
		concat = append(concat, v[:]...)
		wire[uint32(idx)] = v[:]
	}
	digest := sha256.Sum256(concat)
	quote := tpm2.Marshal(tpm2.TPMSAttest{
		Magic:     tpm2.TPMGeneratedValue,
		Type:      tpm2.TPMSTAttestQuote,
		ExtraData: tpm2.TPM2BData{Buffer: binding},
		ClockInfo: o.clock,
		Attested: tpm2.NewTPMUAttest(tpm2.TPMSTAttestQuote, &tpm2.TPMSQuoteInfo{
			PCRSelect: tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{
				{Hash: tpm2.TPMAlgSHA256, PCRSelect: sel},
			}},
			PCRDigest: tpm2.TPM2BDigest{Buffer: digest[:]},
		}),
	})
	h := sha256.Sum256(quote)
	r, s, err := ecdsa.Sign(rand.Reader, c.key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := tpm2.Marshal(tpm2.TPMTSignature{
		SigAlg: tpm2.TPMAlgECDSA,
		Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgECDSA, &tpm2.TPMSSignatureECC{
			Hash:       tpm2.TPMAlgSHA256,
			SignatureR: tpm2.TPM2BECCParameter{Buffer: r.Bytes()},
			SignatureS: tpm2.TPM2BECCParameter{Buffer: s.Bytes()},
		}),
	})
	return mustMarshal(t, &latchkeyv1.TPMEvidence{
		AkPublic: c.akPublic, Quote: quote, Signature: sig, Pcrs: wire,
		FirmwareEventLog: o.fw, SystemdEventLog: o.sd, PcrSignature: o.sig,
	})
}

// The crafted evidence passes when its key is pinned and restricted (so
// the refusal below is due to the attribute alone), and is refused as
// UNTRUSTED_AK when the key is not restricted: a non-restricted key signs
// any digest, so its "quote" proves nothing.
func TestAKWithoutRestrictedAttributeIsRefused(t *testing.T) {
	for _, restricted := range []bool{true, false} {
		c := newCrafted(t, restricted)
		binding := newBinding(t)
		v := newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{c.akHash}})
		_, err := attest.Validate(context.Background(), v, c.evidence(t, binding), binding, noRoundTrip(t))
		want := latchkeyv1.Reason_UNTRUSTED_AK
		if restricted {
			want = latchkeyv1.Reason_REASON_UNSPECIFIED
		}
		wantReason(t, err, want)
	}
}

// An unpinned AK without EK is refused before any round trip.
func TestUnpinnedAKWithoutEKIsRefused(t *testing.T) {
	c := newCrafted(t, true)
	binding := newBinding(t)
	v := newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{newCrafted(t, true).akHash}})
	_, err := attest.Validate(context.Background(), v, c.evidence(t, binding), binding, noRoundTrip(t))
	wantReason(t, err, latchkeyv1.Reason_UNTRUSTED_AK)
}

// otherCAPEM is a self-signed CA that issued no EK certificate here.
func otherCAPEM(t testing.TB) string {
	t.Helper()
	return string(pkitest.NewCA(t, "untrusted ek ca").PEM())
}

// Verify applies no reference value: a quote of PCRs the policy does not
// list verifies, and CheckPolicy refuses its state naming the PCR.
func TestVerifyThenCheckPolicy(t *testing.T) {
	c := newCrafted(t, true)
	binding := newBinding(t)
	v := newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{c.akHash}, PCRs: map[int][]string{0: {strings.Repeat("11", 32)}}})
	ver, err := v.Verify(context.Background(), c.evidence(t, binding), binding, noRoundTrip(t))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	err = v.CheckPolicy(ver.State.(*tpm.State))
	wantReason(t, err, latchkeyv1.Reason_PCR_MISMATCH)
	if !strings.Contains(err.Error(), "pcr 0 holds "+strings.Repeat("00", 32)+", not a value the policy lists") {
		t.Fatalf("detail: %v", err)
	}
}
