package tpm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"math/big"
	"slices"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Trust names how the verifier came to trust the AK.
type Trust string

const (
	// TrustAKPin: the AK's hash is in the policy's akPublicKeyHashes.
	TrustAKPin Trust = "ak-pin"
	// TrustEKCertificate: the EK certificate chains to ekCARoots and the
	// AK was activated under that EK.
	TrustEKCertificate Trust = "ek-certificate"
	// TrustEKHash: the EK's hash is in ekPublicKeyHashes and the AK was
	// activated under that EK.
	TrustEKHash Trust = "ek-hash"
)

// State is the verified machine state of a TPM join (Verified.State).
// Every field passed the checks of Verify; nothing unverified is copied.
type State struct {
	// PCRs are the quoted SHA-256 values by PCR index.
	PCRs map[int][sha256.Size]byte
	// AKPublicKeyHash is the AK's "sha256:<hex>" SPKI hash.
	AKPublicKeyHash string
	// EKPublicKeyHash is the EK's "sha256:<hex>" SPKI hash; empty when the
	// AK was pinned, since the EK is then not verified.
	EKPublicKeyHash string
	// Trust says which policy entry made the AK trusted.
	Trust Trust
	// Boot is what the event logs say was measured, replayed against
	// PCRs; nil when the evidence carried no firmware event log.
	Boot *Boot
	// PCR11Signatures are the entries of the PCR signature JSON the
	// agent sent. They are claims, covered by the evidence digest, that
	// only the policy step can check: it holds the keys.
	PCR11Signatures []PCR11Signature
	// Clock is the quote's TPMS_CLOCK_INFO (sealfacts.go).
	Clock Clock
}

var _ attest.State = (*State)(nil)

// Variant is VARIANT_TPM; it makes *State an attest.State.
func (*State) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_TPM }

// Keys are the EK (when it was verified) then the AK, by SPKI hash.
func (s *State) Keys() []attest.Key {
	var keys []attest.Key
	if s.EKPublicKeyHash != "" {
		keys = append(keys, attest.Key{Kind: attest.KeyTPMEK, Value: s.EKPublicKeyHash})
	}
	if s.AKPublicKeyHash != "" {
		keys = append(keys, attest.Key{Kind: attest.KeyTPMAK, Value: s.AKPublicKeyHash})
	}
	return keys
}

// Validator checks TPM evidence against one compiled Policy. It is safe for
// concurrent use and holds no lock: each Verify and CheckPolicy works on
// its own data.
type Validator struct {
	policy *compiledPolicy
	now    func() time.Time // certificate validity; replaced by tests
	rand   io.Reader        // credential secrets
}

var _ attest.Validator = (*Validator)(nil)

// NewValidator compiles p (PEM certificates, digests, key hashes) once, so
// a bad policy fails at load time with an error naming the bad entry.
func NewValidator(p Policy) (*Validator, error) {
	c, err := compile(p)
	if err != nil {
		return nil, fmt.Errorf("tpm policy: %w", err)
	}
	return &Validator{policy: c, now: time.Now, rand: rand.Reader}, nil
}

// Variant is VARIANT_TPM.
func (v *Validator) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_TPM }

// Verify verifies serialized TPMEvidence bound to binding and returns the
// verified state (Verified.State is a *State); it applies no reference
// value, only the policy's trust anchors. attest.Validate runs it and then
// CheckPolicy. The checks run in this order, and the first failure ends
// verification with its reason:
//
//  0. Binding length (INTERNAL): binding must be attest.BindingSize
//     bytes; anything else is a caller error, not evidence.
//  1. Decoding (MALFORMED): size limits (MaxEvidenceSize, per-field
//     limits, MaxEKCertificateSize, the log limits), protobuf, TPM
//     structures (the AK public area canonically encoded), the quote a
//     TPM-generated TPMS_ATTEST of type quote, PCR indices 0..23 with
//     32-byte values, a systemd log only with a firmware log, the PCR
//     signature JSON (decodePCRSignature).
//  2. AK key (UNTRUSTED_AK): the policy must trust something, and the AK
//     must be a restricted, signing-only, fixedTPM, fixedParent,
//     sensitiveDataOrigin ECC P-256 key (a point off the curve is
//     MALFORMED).
//  3. Quote signature (BAD_SIGNATURE): ECDSA-SHA256 by that AK over the
//     quote bytes.
//  4. Binding (BINDING_MISMATCH): the quote's qualifying data must equal
//     binding, so the evidence belongs to this TLS session and Hello.
//  5. AK trust (UNTRUSTED_AK, then ACTIVATION_FAILED): a pinned AK
//     (akPublicKeyHashes) is trusted as is. Otherwise the EK public area
//     (canonically encoded) and certificate are decoded (MALFORMED); the
//     EK must be an RSA-2048 restricted decryption key that is
//     allow-listed (ekPublicKeyHashes) or certified for the same key by an
//     EK certificate chaining to ekCARoots; and the agent must activate a
//     credential made for the AK's name under that EK, through rt (see
//     activateAK for how round-trip failures map).
//  6. PCR values: the quote must select exactly the SHA-256 PCRs the
//     evidence carries (MALFORMED), and their values must hash to the
//     quoted PCR digest (PCR_MISMATCH).
//  7. Event logs (MALFORMED, EVENT_LOG_MISMATCH), when the evidence has a
//     firmware log: replayed against the quoted PCRs (verifyBoot lists
//     its checks) into State.Boot.
//
// The cheapest refusal comes first: evidence replayed on another session
// (no TPM needed to send it) is refused as BINDING_MISMATCH after one
// signature check, before any EK-chain work, MakeCredential or challenge
// round trip. The binding comes after the signature because qualifying
// data is only meaningful once the AK is known to have signed it; until
// step 5 accepts the AK, nothing in the quote but its signature and
// qualifying data is looked at, and a refusal before step 5 releases
// nothing. The logs come last because only quoted, signed, bound PCRs of
// a trusted AK make a replay mean anything. Every failure is an
// *attest.Refusal.
func (v *Validator) Verify(ctx context.Context, evidenceBytes, binding []byte, rt attest.RoundTrip) (*attest.Verified, error) {
	if len(binding) != bindingSize {
		return nil, attest.Refuse(latchkeyv1.Reason_INTERNAL, "binding has %d bytes, want %d", len(binding), bindingSize)
	}
	ev, err := decode(evidenceBytes)
	if err != nil {
		return nil, attest.Refuse(latchkeyv1.Reason_MALFORMED, "tpm evidence: %w", err)
	}
	akHash, err := v.checkAKKey(ev)
	if err != nil {
		return nil, err
	}
	if err := verifyQuoteSignature(ev); err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare(ev.quote.ExtraData.Buffer, binding) != 1 {
		return nil, attest.Refuse(latchkeyv1.Reason_BINDING_MISMATCH, "quote qualifying data is not this session's binding")
	}
	state, identity, err := v.trustAK(ctx, ev, akHash, rt)
	if err != nil {
		return nil, err
	}
	if err := checkQuotedPCRs(ev); err != nil {
		return nil, err
	}
	if len(ev.fwLog) > 0 {
		if state.Boot, err = verifyBoot(ev.pcrs, ev.fwLog, ev.sdLog); err != nil {
			return nil, err
		}
	}
	state.PCRs = verifiedPCRs(ev.pcrs)
	state.PCR11Signatures = ev.pcrSig
	state.Clock = clockOf(ev.quote)
	return &attest.Verified{
		Variant:        latchkeyv1.Variant_VARIANT_TPM,
		EvidenceDigest: attest.EvidenceDigest(evidenceBytes),
		Identity:       identity,
		MachineID:      "tpm-" + identity,
		State:          state,
	}, nil
}

// CheckPolicy compares a state Verify returned with the policy's
// reference values. A state that is not a *State of this package (nil, or
// another variant's) is refused as INTERNAL (attest.StateMismatch). The
// checks, in order:
//
//  1. Components (the policy's boot section, when set): see
//     compiledBoot.check for its checks and reasons. They come first
//     because they name what changed (a UKI, a command line) where a raw
//     PCR value only says that something in the PCR did.
//  2. PCRs (PCR_MISMATCH): every PCR the policy lists must be quoted and
//     hold one of its listed values; the detail names the lowest failing
//     index.
func (v *Validator) CheckPolicy(s attest.State) error {
	st, ok := s.(*State)
	if !ok || st == nil {
		return attest.StateMismatch(latchkeyv1.Variant_VARIANT_TPM, s)
	}
	if v.policy.boot != nil {
		if err := v.policy.boot.check(st); err != nil {
			return err
		}
	}
	return v.checkPolicyPCRs(st)
}

// checkAKKey is step 2 of Verify: it sets ev.akKey for the signature
// check and returns the AK's hash.
func (v *Validator) checkAKKey(ev *evidence) (atls.Pin, error) {
	if !v.policy.hasAnchors() {
		return atls.Pin{}, attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "policy trusts no ak, ek or ek ca")
	}
	if err := checkAK(ev.ak); err != nil {
		return atls.Pin{}, attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "%w", err)
	}
	var err error
	if ev.akKey, err = akKey(ev.ak); err != nil {
		return atls.Pin{}, attest.Refuse(latchkeyv1.Reason_MALFORMED, "tpm evidence: %w", err)
	}
	akHash, err := keyHash(ev.akKey)
	if err != nil {
		return atls.Pin{}, attest.Refuse(latchkeyv1.Reason_INTERNAL, "%w", err)
	}
	return akHash, nil
}

// trustAK is step 5 of Verify. It returns the state's key fields and
// the identity ("ak:sha256:…" for a pinned AK, "ek:sha256:…" otherwise).
func (v *Validator) trustAK(ctx context.Context, ev *evidence, akHash atls.Pin, rt attest.RoundTrip) (*State, string, error) {
	if pinned(v.policy.akHashes, akHash) {
		return &State{AKPublicKeyHash: akHash.String(), Trust: TrustAKPin}, "ak:" + akHash.String(), nil
	}
	ekHash, trust, err := v.trustEK(ev)
	if err != nil {
		return nil, "", err
	}
	if err := activateAK(ctx, rt, v.rand, ev.ek, objectName(ev.akRaw)); err != nil {
		return nil, "", err
	}
	st := &State{AKPublicKeyHash: akHash.String(), EKPublicKeyHash: ekHash.String(), Trust: trust}
	return st, "ek:" + ekHash.String(), nil
}

// trustEK decides whether the EK is trusted, by hash allow-list first
// (no certificate work) and then by certificate chain.
func (v *Validator) trustEK(ev *evidence) (atls.Pin, Trust, error) {
	if err := ev.decodeEK(); err != nil {
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_MALFORMED, "tpm evidence: %w", err)
	}
	if ev.ek == nil {
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "ak is not pinned and the evidence carries no ek")
	}
	if err := checkEK(ev.ek); err != nil {
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "%w", err)
	}
	key, err := ekKey(ev.ek)
	if err != nil {
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "%w", err)
	}
	ekHash, err := keyHash(key)
	if err != nil {
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_INTERNAL, "%w", err)
	}
	if pinned(v.policy.ekHashes, ekHash) {
		return ekHash, TrustEKHash, nil
	}
	switch {
	case v.policy.roots == nil:
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "ek %s is not allow-listed", ekHash)
	case ev.ekCert == nil:
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "ek %s is not allow-listed and has no certificate", ekHash)
	}
	if err := verifyEKCert(ev.ekCert, v.policy.roots, key, v.now()); err != nil {
		return atls.Pin{}, "", attest.Refuse(latchkeyv1.Reason_UNTRUSTED_AK, "ek %s: %w", ekHash, err)
	}
	return ekHash, TrustEKCertificate, nil
}

// verifyQuoteSignature is step 3 of Verify.
func verifyQuoteSignature(ev *evidence) error {
	if ev.sig.SigAlg != tpm2.TPMAlgECDSA {
		return attest.Refuse(latchkeyv1.Reason_BAD_SIGNATURE, "quote signature is not ecdsa")
	}
	sig, err := ev.sig.Signature.ECDSA()
	if err != nil || sig.Hash != tpm2.TPMAlgSHA256 {
		return attest.Refuse(latchkeyv1.Reason_BAD_SIGNATURE, "quote signature is not ecdsa-sha256")
	}
	digest := sha256.Sum256(ev.quoteRaw)
	r := new(big.Int).SetBytes(sig.SignatureR.Buffer)
	s := new(big.Int).SetBytes(sig.SignatureS.Buffer)
	if !ecdsa.Verify(ev.akKey, digest[:], r, s) {
		return attest.Refuse(latchkeyv1.Reason_BAD_SIGNATURE, "quote signature does not verify with the ak")
	}
	return nil
}

// checkQuotedPCRs is step 6 of Verify.
func checkQuotedPCRs(ev *evidence) error {
	quoted, err := selected(ev.quoteInfo.PCRSelect)
	if err != nil {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "quote pcr selection: %w", err)
	}
	sent := slices.Sorted(maps.Keys(ev.pcrs))
	if !slices.Equal(quoted, sent) {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "quote selects pcrs %v, evidence carries %v", quoted, sent)
	}
	if !bytes.Equal(pcrDigest(sent, ev.pcrs), ev.quoteInfo.PCRDigest.Buffer) {
		return attest.Refuse(latchkeyv1.Reason_PCR_MISMATCH, "pcr values do not hash to the quoted digest")
	}
	return nil
}

// checkPolicyPCRs is step 2 of CheckPolicy.
func (v *Validator) checkPolicyPCRs(st *State) error {
	for _, idx := range v.policy.pcrOrder {
		got, ok := st.PCRs[idx]
		if !ok {
			return attest.Refuse(latchkeyv1.Reason_PCR_MISMATCH, "pcr %d is in the policy but not quoted", idx)
		}
		if !slices.Contains(v.policy.pcrs[idx], got) {
			return attest.Refuse(latchkeyv1.Reason_PCR_MISMATCH, "pcr %d holds %s, not a value the policy lists", idx, hex.EncodeToString(got[:]))
		}
	}
	return nil
}

func verifiedPCRs(in map[int][]byte) map[int][sha256.Size]byte {
	out := make(map[int][sha256.Size]byte, len(in))
	for p, v := range in {
		out[p] = [sha256.Size]byte(v)
	}
	return out
}
