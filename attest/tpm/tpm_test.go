package tpm_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	tpmwire "github.com/latchkey/latchkey/attest/tpm/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// fixture is one swtpm, an issuer on it and the machine's measured policy.
type fixture struct {
	sim      *tpmtest.Simulator
	issuer   *tpmissuer.Issuer
	measured *tpm.Policy // current PCRs + EK hash
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	sim := tpmtest.Start(t)
	iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device})
	if err != nil {
		t.Fatalf("issuer.New: %v", err)
	}
	t.Cleanup(func() { _ = iss.Close() })
	return &fixture{sim: sim, issuer: iss, measured: measure(t, sim)}
}

func measure(t *testing.T, sim *tpmtest.Simulator) *tpm.Policy {
	t.Helper()
	p, err := tpmissuer.Measure(context.Background(), sim.Device, nil)
	if err != nil {
		t.Fatalf("Measure: %v", err)
	}
	return p
}

func newBinding(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, attest.BindingSize)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// attestNow makes evidence for binding; the attestation is closed when the
// test ends (or earlier by the test).
func (f *fixture) attestNow(t *testing.T, binding []byte) attest.Attestation {
	t.Helper()
	a, err := f.issuer.Attest(context.Background(), binding)
	if err != nil {
		t.Fatalf("Attest: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// caPolicy trusts the simulator's EK CA and the measured PCRs.
func (f *fixture) caPolicy() tpm.Policy {
	return tpm.Policy{PCRs: f.measured.PCRs, EKCARoots: f.sim.EKCARootsPEM}
}

// hashPolicy trusts the measured EK hash and PCRs, as `measure` prints it.
func (f *fixture) hashPolicy() tpm.Policy { return *f.measured }

func newValidator(t testing.TB, p tpm.Policy) *tpm.Validator {
	t.Helper()
	v, err := tpm.NewValidator(p)
	if err != nil {
		t.Fatalf("NewValidator: %v", err)
	}
	return v
}

func wantReason(t *testing.T, err error, want latchkeyv1.Reason) {
	t.Helper()
	if got := attest.ReasonOf(err); got != want {
		t.Fatalf("reason = %v (err %v), want %v", got, err, want)
	}
}

// noRoundTrip fails the test if validation asks for a challenge.
func noRoundTrip(t *testing.T) attest.RoundTrip {
	return func(context.Context, []byte) ([]byte, error) {
		t.Error("unexpected challenge round trip")
		return nil, errors.New("no round trip")
	}
}

func stateOf(t *testing.T, v *attest.Verified) *tpm.State {
	t.Helper()
	st, ok := v.State.(*tpm.State)
	if !ok {
		t.Fatalf("State is %T, want *tpm.State", v.State)
	}
	return st
}

func TestValidateEKCertificateWithActivation(t *testing.T) {
	f := newFixture(t)
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	rounds := 0
	rt := func(ctx context.Context, ch []byte) ([]byte, error) { rounds++; return a.Respond(ctx, ch) }

	got, err := attest.Validate(context.Background(), newValidator(t, f.caPolicy()), a.Evidence(), binding, rt)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	st := stateOf(t, got)
	if rounds != 1 || st.Trust != tpm.TrustEKCertificate {
		t.Errorf("rounds = %d, trust = %q; want 1 activation through the ek certificate", rounds, st.Trust)
	}
	if got.Variant != latchkeyv1.Variant_VARIANT_TPM || got.EvidenceDigest != attest.EvidenceDigest(a.Evidence()) {
		t.Errorf("variant %v / evidence digest wrong", got.Variant)
	}
	if want := "ek:" + f.measured.EKPublicKeyHashes[0]; got.Identity != want || st.EKPublicKeyHash != f.measured.EKPublicKeyHashes[0] {
		t.Errorf("identity %q, ek hash %q; want %q", got.Identity, st.EKPublicKeyHash, want)
	}
	checkStatePCRs(t, st, f.measured)
}

// checkStatePCRs compares the verified PCRs with the measured ones.
func checkStatePCRs(t *testing.T, st *tpm.State, measured *tpm.Policy) {
	t.Helper()
	if len(st.PCRs) != len(tpmwire.DefaultPCRs) {
		t.Fatalf("state has %d pcrs, want %d", len(st.PCRs), len(tpmwire.DefaultPCRs))
	}
	for idx, want := range measured.PCRs {
		v := st.PCRs[idx]
		if got := hex.EncodeToString(v[:]); got != want[0] {
			t.Errorf("pcr %d = %s, want %s", idx, got, want[0])
		}
	}
}

func TestValidateEKHashWithActivation(t *testing.T) {
	f := newFixture(t)
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	got, err := attest.Validate(context.Background(), newValidator(t, f.hashPolicy()), a.Evidence(), binding, a.Respond)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if st := stateOf(t, got); st.Trust != tpm.TrustEKHash {
		t.Errorf("trust = %q, want %q", st.Trust, tpm.TrustEKHash)
	}
}

func TestValidatePinnedAKNeedsNoActivation(t *testing.T) {
	f := newFixture(t)
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	first, err := attest.Validate(context.Background(), newValidator(t, f.hashPolicy()), a.Evidence(), binding, a.Respond)
	if err != nil {
		t.Fatalf("Validate (ek): %v", err)
	}
	akHash := stateOf(t, first).AKPublicKeyHash

	pinned := tpm.Policy{PCRs: f.measured.PCRs, AKPublicKeyHashes: []string{akHash}}
	got, err := attest.Validate(context.Background(), newValidator(t, pinned), a.Evidence(), binding, noRoundTrip(t))
	if err != nil {
		t.Fatalf("Validate (pinned ak): %v", err)
	}
	st := stateOf(t, got)
	if st.Trust != tpm.TrustAKPin || got.Identity != "ak:"+akHash || st.EKPublicKeyHash != "" {
		t.Errorf("trust %q identity %q ek hash %q: want pinned ak, no unverified ek", st.Trust, got.Identity, st.EKPublicKeyHash)
	}
}

// The AK is a primary key, so a pin survives a reboot.
func TestAKIsStableAcrossRestart(t *testing.T) {
	f := newFixture(t)
	akHash := func() string {
		binding := newBinding(t)
		a := f.attestNow(t, binding)
		defer a.Close()
		got, err := attest.Validate(context.Background(), newValidator(t, f.hashPolicy()), a.Evidence(), binding, a.Respond)
		if err != nil {
			t.Fatalf("Validate: %v", err)
		}
		return stateOf(t, got).AKPublicKeyHash
	}
	before := akHash()
	f.sim.Restart(t)
	if after := akHash(); after != before {
		t.Errorf("ak hash changed across restart: %s -> %s", before, after)
	}
}

func TestSequentialAttestationsLeaveNoTransientObjects(t *testing.T) {
	f := newFixture(t)
	v := newValidator(t, f.caPolicy())
	for i := range 10 {
		binding := newBinding(t)
		a, err := f.issuer.Attest(context.Background(), binding)
		if err != nil {
			t.Fatalf("Attest %d: %v", i, err)
		}
		_, err = attest.Validate(context.Background(), v, a.Evidence(), binding, a.Respond)
		if cerr := a.Close(); err != nil || cerr != nil {
			t.Fatalf("attempt %d: validate %v, close %v", i, err, cerr)
		}
	}
	if h := f.sim.TransientHandles(t); len(h) != 0 {
		t.Errorf("transient handles left: %v", h)
	}
	if h := f.sim.LoadedSessions(t); len(h) != 0 {
		t.Errorf("sessions left: %v", h)
	}
}

// A TPM with only one free object slot and no persisted EK makes Attest
// fail after deriving the EK; the EK must be flushed on that error path.
func TestFailedAttestFlushesWhatItCreated(t *testing.T) {
	f := newFixture(t)
	evictPersistentEK(t, f.sim.Device)
	occupied := f.sim.FillTransientSlots(t, 2)
	a, err := f.issuer.Attest(context.Background(), newBinding(t))
	if err == nil {
		_ = a.Close()
		t.Fatal("Attest succeeded with one free object slot")
	}
	t.Logf("attest failed as intended: %v", err)
	if h := f.sim.TransientHandles(t); len(h) != len(occupied) {
		t.Errorf("transient handles %v, want only the test's %v", h, occupied)
	}
}

// A challenge the TPM cannot activate fails without leaking the policy
// session, and the attestation still closes cleanly.
func TestFailedRespondFlushesSession(t *testing.T) {
	f := newFixture(t)
	a, err := f.issuer.Attest(context.Background(), newBinding(t))
	if err != nil {
		t.Fatalf("Attest: %v", err)
	}
	bogus, _ := proto.Marshal(&latchkeyv1.TPMChallenge{CredentialBlob: make([]byte, 68), EncryptedSecret: make([]byte, 256)})
	if _, err := a.Respond(context.Background(), bogus); err == nil {
		t.Error("Respond accepted a bogus challenge")
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if h := f.sim.LoadedSessions(t); len(h) != 0 {
		t.Errorf("sessions left: %v", h)
	}
	if h := f.sim.TransientHandles(t); len(h) != 0 {
		t.Errorf("transient handles left: %v", h)
	}
}

// Without an EK persisted at 0x81010001 the issuer derives it, gets the
// same key, and flushes it.
func TestAttestWithoutPersistedEK(t *testing.T) {
	f := newFixture(t)
	evictPersistentEK(t, f.sim.Device)
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	got, err := attest.Validate(context.Background(), newValidator(t, f.caPolicy()), a.Evidence(), binding, a.Respond)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if got.Identity != "ek:"+f.measured.EKPublicKeyHashes[0] {
		t.Errorf("identity %q, want the persisted ek's %q", got.Identity, f.measured.EKPublicKeyHashes[0])
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if h := f.sim.TransientHandles(t); len(h) != 0 {
		t.Errorf("transient handles left: %v", h)
	}
}

func evictPersistentEK(t *testing.T, device string) {
	t.Helper()
	tp, err := tpmissuer.OpenDevice(device)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	const ekHandle = tpm2.TPMHandle(0x81010001)
	pub, err := tpm2.ReadPublic{ObjectHandle: ekHandle}.Execute(tp)
	if err != nil {
		t.Fatalf("swtpm has no persisted ek: %v", err)
	}
	if _, err := (tpm2.EvictControl{
		Auth:             tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		ObjectHandle:     tpm2.NamedHandle{Handle: ekHandle, Name: pub.Name},
		PersistentHandle: ekHandle,
	}).Execute(tp); err != nil {
		t.Fatalf("evict ek: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name   string
		policy func() tpm.Policy
		// mutate may change the evidence, the binding given to Validate,
		// or the round trip.
		mutate func(ev *latchkeyv1.TPMEvidence, binding *[]byte, rt *attest.RoundTrip)
		want   latchkeyv1.Reason
	}{
		{
			name: "pcr value not in policy",
			policy: func() tpm.Policy {
				p := f.caPolicy()
				p.PCRs = map[int][]string{7: {strings.Repeat("ab", 32), strings.Repeat("cd", 32)}}
				return p
			},
			want: latchkeyv1.Reason_PCR_MISMATCH,
		},
		{
			name: "policy pcr not quoted",
			policy: func() tpm.Policy {
				p := f.caPolicy()
				p.PCRs = map[int][]string{16: {strings.Repeat("00", 32)}}
				return p
			},
			want: latchkeyv1.Reason_PCR_MISMATCH,
		},
		{
			name:   "binding mismatch",
			policy: f.caPolicy,
			mutate: func(_ *latchkeyv1.TPMEvidence, b *[]byte, _ *attest.RoundTrip) { *b = newBinding(t) },
			want:   latchkeyv1.Reason_BINDING_MISMATCH,
		},
		{
			name:   "ek certificate from an untrusted ca",
			policy: func() tpm.Policy { return tpm.Policy{EKCARoots: []string{otherCAPEM(t)}} },
			want:   latchkeyv1.Reason_UNTRUSTED_AK,
		},
		{
			name: "ek neither certified nor allow-listed",
			policy: func() tpm.Policy {
				return tpm.Policy{EKPublicKeyHashes: []string{"sha256:" + strings.Repeat("00", 32)}}
			},
			want: latchkeyv1.Reason_UNTRUSTED_AK,
		},
		{
			name:   "policy with no trust anchors",
			policy: func() tpm.Policy { return tpm.Policy{} },
			want:   latchkeyv1.Reason_UNTRUSTED_AK,
		},
		{
			name:   "wrong activation answer",
			policy: f.caPolicy,
			mutate: func(_ *latchkeyv1.TPMEvidence, _ *[]byte, rt *attest.RoundTrip) {
				*rt = func(context.Context, []byte) ([]byte, error) {
					return proto.Marshal(&latchkeyv1.TPMChallengeResponse{Secret: newBinding(t)})
				}
			},
			want: latchkeyv1.Reason_ACTIVATION_FAILED,
		},
		{
			name:   "round trip fails",
			policy: f.caPolicy,
			mutate: func(_ *latchkeyv1.TPMEvidence, _ *[]byte, rt *attest.RoundTrip) {
				*rt = func(context.Context, []byte) ([]byte, error) { return nil, errors.New("stream closed") }
			},
			want: latchkeyv1.Reason_ACTIVATION_FAILED,
		},
		{
			name:   "unparsable activation answer",
			policy: f.caPolicy,
			mutate: func(_ *latchkeyv1.TPMEvidence, _ *[]byte, rt *attest.RoundTrip) {
				*rt = func(context.Context, []byte) ([]byte, error) { return []byte{0xff, 0xff, 0xff}, nil }
			},
			want: latchkeyv1.Reason_MALFORMED,
		},
		{
			// The quote was signed by the real AK: the swapped key is
			// refused at the signature, before any activation.
			name:   "ak swapped for another tpm's key: the quote does not verify",
			policy: f.hashPolicy,
			mutate: func(ev *latchkeyv1.TPMEvidence, _ *[]byte, _ *attest.RoundTrip) {
				ev.AkPublic = craftedAKPublic(t, true)
			},
			want: latchkeyv1.Reason_BAD_SIGNATURE,
		},
		{
			name:   "tampered signature",
			policy: f.caPolicy,
			mutate: func(ev *latchkeyv1.TPMEvidence, _ *[]byte, _ *attest.RoundTrip) {
				ev.Signature[len(ev.Signature)-1] ^= 1
			},
			want: latchkeyv1.Reason_BAD_SIGNATURE,
		},
		{
			name:   "pcr value edited",
			policy: func() tpm.Policy { p := f.caPolicy(); p.PCRs = nil; return p },
			mutate: func(ev *latchkeyv1.TPMEvidence, _ *[]byte, _ *attest.RoundTrip) { ev.Pcrs[4][0] ^= 1 },
			want:   latchkeyv1.Reason_PCR_MISMATCH,
		},
		{
			name:   "pcr added that the quote does not cover",
			policy: f.caPolicy,
			mutate: func(ev *latchkeyv1.TPMEvidence, _ *[]byte, _ *attest.RoundTrip) { ev.Pcrs[16] = make([]byte, 32) },
			want:   latchkeyv1.Reason_MALFORMED,
		},
		{
			name:   "truncated quote",
			policy: f.caPolicy,
			mutate: func(ev *latchkeyv1.TPMEvidence, _ *[]byte, _ *attest.RoundTrip) {
				ev.Quote = ev.Quote[:len(ev.Quote)-3]
			},
			want: latchkeyv1.Reason_MALFORMED,
		},
		{
			name:   "trailing bytes after the ak public area",
			policy: f.caPolicy,
			mutate: func(ev *latchkeyv1.TPMEvidence, _ *[]byte, _ *attest.RoundTrip) { ev.AkPublic = append(ev.AkPublic, 0) },
			want:   latchkeyv1.Reason_MALFORMED,
		},
		{
			name:   "oversized ek certificate",
			policy: f.caPolicy,
			mutate: func(ev *latchkeyv1.TPMEvidence, _ *[]byte, _ *attest.RoundTrip) {
				ev.EkCertificate = make([]byte, tpmwire.MaxEKCertificateSize+1)
			},
			want: latchkeyv1.Reason_MALFORMED,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binding := newBinding(t)
			a := f.attestNow(t, binding)
			ev := &latchkeyv1.TPMEvidence{}
			if err := proto.Unmarshal(a.Evidence(), ev); err != nil {
				t.Fatal(err)
			}
			rt := attest.RoundTrip(a.Respond)
			if tc.mutate != nil {
				tc.mutate(ev, &binding, &rt)
			}
			raw, err := proto.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			got, err := attest.Validate(context.Background(), newValidator(t, tc.policy()), raw, binding, rt)
			if got != nil {
				t.Errorf("refused validation returned data: %+v", got)
			}
			wantReason(t, err, tc.want)
			t.Logf("refused: %v", err)
		})
	}
}

// A second, independently manufactured swtpm has its own EK and CA: its
// certificate does not chain to the first one's CA.
func TestEKCertificateFromAnotherSwtpmCA(t *testing.T) {
	f, other := newFixture(t), tpmtest.StartFresh(t)
	iss, err := tpmissuer.New(tpmissuer.Config{Device: other.Device})
	if err != nil {
		t.Fatal(err)
	}
	binding := newBinding(t)
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		t.Fatalf("Attest: %v", err)
	}
	defer a.Close()
	_, err = attest.Validate(context.Background(), newValidator(t, f.caPolicy()), a.Evidence(), binding, a.Respond)
	wantReason(t, err, latchkeyv1.Reason_UNTRUSTED_AK)
	_, err = attest.Validate(context.Background(), newValidator(t, tpm.Policy{EKCARoots: other.EKCARootsPEM}), a.Evidence(), binding, a.Respond)
	if err != nil {
		t.Errorf("own CA refused: %v", err)
	}
}

func TestMalformedEvidence(t *testing.T) {
	v := newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{"sha256:" + strings.Repeat("00", 32)}})
	for name, ev := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("not a protobuf message at all"),
		"oversized": make([]byte, tpmwire.MaxEvidenceSize+1),
		"no quote":  mustMarshal(t, &latchkeyv1.TPMEvidence{AkPublic: []byte{1}, Signature: []byte{1}}),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := attest.Validate(context.Background(), v, ev, newBinding(t), noRoundTrip(t))
			wantReason(t, err, latchkeyv1.Reason_MALFORMED)
		})
	}
}

func TestExtendChangesMeasurementAndRestartResetsIt(t *testing.T) {
	sim := tpmtest.Start(t)
	before := measure(t, sim)
	sim.Extend(t, 9, []byte("a new kernel"))
	extended := measure(t, sim)
	if extended.PCRs[9][0] == before.PCRs[9][0] || extended.PCRs[8][0] != before.PCRs[8][0] {
		t.Errorf("extend of pcr 9: pcr 9 %s -> %s, pcr 8 %s -> %s", before.PCRs[9][0], extended.PCRs[9][0], before.PCRs[8][0], extended.PCRs[8][0])
	}
	sim.Restart(t)
	if after := measure(t, sim); after.PCRs[9][0] != before.PCRs[9][0] || after.EKPublicKeyHashes[0] != before.EKPublicKeyHashes[0] {
		t.Errorf("after restart: pcr 9 %s (want %s), ek %v (want %v)", after.PCRs[9][0], before.PCRs[9][0], after.EKPublicKeyHashes, before.EKPublicKeyHashes)
	}
}

// A measured PCR that changes after the policy was captured is refused.
func TestExtendedPCRIsRefused(t *testing.T) {
	f := newFixture(t)
	f.sim.Extend(t, 4, []byte("unexpected boot loader"))
	binding := newBinding(t)
	a := f.attestNow(t, binding)
	_, err := attest.Validate(context.Background(), newValidator(t, f.caPolicy()), a.Evidence(), binding, a.Respond)
	wantReason(t, err, latchkeyv1.Reason_PCR_MISMATCH)
	if !strings.Contains(err.Error(), "pcr 4 ") {
		t.Errorf("refusal %q does not name pcr 4", err)
	}
}

func TestIssuerConfig(t *testing.T) {
	for name, pcrs := range map[string][]int{"out of range": {24}, "negative": {-1}, "duplicate": {7, 7}} {
		if _, err := tpmissuer.New(tpmissuer.Config{Device: "tcp://127.0.0.1:1", PCRs: pcrs}); err == nil {
			t.Errorf("%s: issuer.New accepted pcrs %v", name, pcrs)
		}
	}
	if _, err := tpmissuer.New(tpmissuer.Config{Device: "/nonexistent/tpm"}); err == nil {
		t.Error("issuer.New accepted a missing device")
	}
	sim := tpmtest.Start(t)
	iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iss.Attest(context.Background(), make([]byte, 31)); err == nil {
		t.Error("Attest accepted a 31-byte binding")
	}
}

func TestCustomPCRSelection(t *testing.T) {
	sim := tpmtest.Start(t)
	iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device, PCRs: []int{23, 0, 16, 7, 8, 9, 10, 11, 12, 13}})
	if err != nil {
		t.Fatal(err)
	}
	binding := newBinding(t)
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		t.Fatalf("Attest: %v", err)
	}
	defer a.Close()
	got, err := attest.Validate(context.Background(), newValidator(t, tpm.Policy{EKCARoots: sim.EKCARootsPEM}), a.Evidence(), binding, a.Respond)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if n := len(stateOf(t, got).PCRs); n != 10 {
		t.Errorf("state has %d pcrs, want 10", n)
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pcrPolicy turns verified PCR values into policy entries.
func pcrPolicy(pcrs map[int][32]byte) map[int][]string {
	out := make(map[int][]string, len(pcrs))
	for idx, v := range pcrs {
		out[idx] = []string{hex.EncodeToString(v[:])}
	}
	return out
}
