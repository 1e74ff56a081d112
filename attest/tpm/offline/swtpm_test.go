package offline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// grantPCRs are the PCRs the tests seal to; bootPCR is the one a "boot"
// extends (the UKI's PCR 11).
var grantPCRs = []uint32{0, 7, 11}

const bootPCR = 11

// machine is one swtpm with a sealed key, and what sealed it.
type machine struct {
	sim    *tpmtest.Simulator
	auth   *Authorizer
	key    []byte
	sealed *Sealed
	grant  *latchkeyv1.OfflineGrant
}

// with runs f on a connection of its own: swtpm serves one at a time, and
// the simulator's Restart and Extend open their own.
func with[T any](t testing.TB, sim *tpmtest.Simulator, f func(transport.TPM) T) T {
	t.Helper()
	tp, err := tpm.OpenDevice(sim.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	return f(tp)
}

// boot measures the test's "genuine software" into the boot PCR, as every
// boot of the machine does.
func boot(t testing.TB, sim *tpmtest.Simulator) { sim.Extend(t, bootPCR, []byte("genuine uki")) }

// reboot power-cycles the TPM (resetCount + 1) and boots the same software.
func reboot(t testing.TB, sim *tpmtest.Simulator) {
	sim.Restart(t)
	boot(t, sim)
}

// attest is what a verifier reads from a verified quote in this boot:
// the PCR values and the TPM's clock info, as a grant request.
func attest(t testing.TB, sim *tpmtest.Simulator, maxBoots, maxHours uint32) GrantRequest {
	t.Helper()
	return with(t, sim, func(tp transport.TPM) GrantRequest {
		req := GrantRequest{
			PolicyRef: PolicyRef([]byte("ek digest"), "state-disk-uuid"),
			PCRs:      map[uint32][]byte{},
			MaxBoots:  maxBoots,
			MaxHours:  maxHours,
		}
		for _, i := range grantPCRs {
			v, err := readPCR(tp, i)
			if err != nil {
				t.Fatal(err)
			}
			req.PCRs[i] = v
		}
		clock, err := tpm2.ReadClock{}.Execute(tp)
		if err != nil {
			t.Fatal(err)
		}
		req.ResetCount = clock.CurrentTime.ClockInfo.ResetCount
		req.ClockMS = clock.CurrentTime.ClockInfo.Clock
		return req
	})
}

// newMachine starts a swtpm, boots it, has it granted and seals a key.
func newMachine(t testing.TB, maxBoots, maxHours uint32) *machine {
	t.Helper()
	tpmtest.CheckTools(t)
	m := &machine{sim: tpmtest.Start(t), auth: testAuthorizer(t, testSecret(1)), key: bytes.Repeat([]byte{0x5a}, 32)}
	boot(t, m.sim)
	m.grant = m.grantNow(t, maxBoots, maxHours)
	m.sealed = with(t, m.sim, func(tp transport.TPM) *Sealed {
		rec := &recorder{TPM: tp}
		s, err := Seal(rec, m.key, m.grant)
		if err != nil {
			t.Fatal(err)
		}
		if rec.saw(m.key) {
			t.Error("the key crossed the TPM connection in clear while sealing")
		}
		return s
	})
	if h := m.sim.TransientHandles(t); len(h) != 0 {
		t.Errorf("Seal left transient objects %v", h)
	}
	if h := m.sim.LoadedSessions(t); len(h) != 0 {
		t.Errorf("Seal left sessions %v", h)
	}
	return m
}

// recorder keeps every command and response sent through it.
type recorder struct {
	transport.TPM
	traffic [][]byte
}

func (r *recorder) Send(cmd []byte) ([]byte, error) {
	rsp, err := r.TPM.Send(cmd)
	r.traffic = append(r.traffic, bytes.Clone(cmd), bytes.Clone(rsp))
	return rsp, err
}

func (r *recorder) saw(secret []byte) bool {
	for _, b := range r.traffic {
		if bytes.Contains(b, secret) {
			return true
		}
	}
	return false
}

func (m *machine) grantNow(t testing.TB, maxBoots, maxHours uint32) *latchkeyv1.OfflineGrant {
	t.Helper()
	g, err := m.auth.Grant(attest(t, m.sim, maxBoots, maxHours))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func (m *machine) unseal(t testing.TB, s *Sealed, g *latchkeyv1.OfflineGrant) ([]byte, Status, error) {
	t.Helper()
	type result struct {
		key []byte
		st  Status
		err error
	}
	r := with(t, m.sim, func(tp transport.TPM) result {
		k, st, err := Unseal(tp, s, g)
		return result{k, st, err}
	})
	if h := m.sim.TransientHandles(t); len(h) != 0 {
		t.Errorf("Unseal left transient objects %v", h)
	}
	if h := m.sim.LoadedSessions(t); len(h) != 0 {
		t.Errorf("Unseal left sessions %v", h)
	}
	return r.key, r.st, r.err
}

// mustUnseal expects the sealed key back.
func (m *machine) mustUnseal(t testing.TB, g *latchkeyv1.OfflineGrant) Status {
	t.Helper()
	key, st, err := m.unseal(t, m.sealed, g)
	if err != nil {
		t.Fatalf("unseal: %v", err)
	}
	if !bytes.Equal(key, m.key) {
		t.Fatal("unsealed a different key")
	}
	return st
}

// refused expects exactly the reason want (and no other Err value) with
// detail in the message.
func refused(t testing.TB, err, want error, detail string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
	for _, other := range []error{ErrBootsSpent, ErrExpired, ErrPCRMismatch, ErrWithdrawn, ErrBadGrant} {
		if other != want && errors.Is(err, other) {
			t.Fatalf("err = %v wraps %v too", err, other)
		}
	}
	if !strings.Contains(err.Error(), detail) {
		t.Fatalf("err = %q, want detail %q", err, detail)
	}
}

func TestUnsealInMatchingBoot(t *testing.T) {
	m := newMachine(t, 3, 24)
	reboot(t, m.sim)
	st := m.mustUnseal(t, m.grant)
	// The key leaves the TPM encrypted to the session salted to the SRK.
	with(t, m.sim, func(tp transport.TPM) error {
		rec := &recorder{TPM: tp}
		if key, _, err := Unseal(rec, m.sealed, m.grant); err != nil || !bytes.Equal(key, m.key) {
			t.Fatalf("unseal: %v", err)
		}
		if rec.saw(m.key) {
			t.Error("the key crossed the TPM connection in clear while unsealing")
		}
		return nil
	})
	if st.Boot != 1 || st.MaxBoots != 3 || st.HoursLeft <= 23 || st.HoursLeft > 24 {
		t.Errorf("status %+v, want boot 1 of 3, 23-24 hours left", st)
	}
	// The sealed key survives its encoding, as the agent stores it.
	b, err := m.sealed.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var s Sealed
	if err := s.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if key, _, err := m.unseal(t, &s, m.grant); err != nil || !bytes.Equal(key, m.key) {
		t.Fatalf("decoded sealed key: %v", err)
	}
}

func TestUnsealRefusesChangedPCR(t *testing.T) {
	m := newMachine(t, 3, 24)
	reboot(t, m.sim)
	m.sim.Extend(t, bootPCR, []byte("another uki"))
	_, st, err := m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrPCRMismatch, "PCRs differing: [11]")
	if st.Boot != 1 {
		t.Errorf("status %+v, want boot 1", st)
	}
	// Slipping past it: the grant edited to this boot's values.
	edited := cloneGrant(m.grant)
	v := with(t, m.sim, func(tp transport.TPM) []byte { v, _ := readPCR(tp, bootPCR); return v })
	edited.Pcrs[bootPCR] = v
	_, _, err = m.unseal(t, m.sealed, edited)
	refused(t, err, ErrBadGrant, "signature does not cover this grant")
}

func TestUnsealRefusesAfterMaxBoots(t *testing.T) {
	m := newMachine(t, 2, 24)
	for boot := uint32(1); boot <= 2; boot++ {
		reboot(t, m.sim)
		if st := m.mustUnseal(t, m.grant); st.Boot != boot {
			t.Fatalf("status %+v, want boot %d", st, boot)
		}
	}
	reboot(t, m.sim)
	_, st, err := m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrBootsSpent, "this is boot 3 since the grant, 2 allowed")
	if st.Boot != 3 || st.MaxBoots != 2 {
		t.Errorf("status %+v, want boot 3 of 2", st)
	}
}

func TestUnsealRefusesPastMaxHours(t *testing.T) {
	m := newMachine(t, 3, 2)
	last := m.grant.ClockMs + 2*msPerHour
	clockSet(t, m.sim, last-60_000)
	if st := m.mustUnseal(t, m.grant); st.HoursLeft <= 0 || st.HoursLeft > 0.02 {
		t.Errorf("status %+v, want under a minute left", st)
	}
	clockSet(t, m.sim, last+60_000)
	_, st, err := m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrExpired, "hours of TPM time since the grant, 2 allowed")
	if st.HoursLeft != 0 {
		t.Errorf("status %+v, want no hours left", st)
	}
}

func TestUnsealRefusesAfterWithdraw(t *testing.T) {
	m := newMachine(t, 3, 24)
	copied, err := m.sealed.MarshalBinary() // a copy of the token taken before
	if err != nil {
		t.Fatal(err)
	}
	with(t, m.sim, func(tp transport.TPM) error {
		if err := Withdraw(tp, m.sealed); err != nil {
			t.Fatal(err)
		}
		return nil
	})
	_, _, err = m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrWithdrawn, "the grant counter is 2, sealed at 1")

	var old Sealed
	if err := old.UnmarshalBinary(copied); err != nil {
		t.Fatal(err)
	}
	_, _, err = m.unseal(t, &old, m.grant)
	refused(t, err, ErrWithdrawn, "the grant counter is 2, sealed at 1")

	// Slipping past it: the copy's counter edited to the current value.
	edited := old
	edited.Counter = 2
	_, _, err = m.unseal(t, &edited, m.grant)
	refused(t, err, ErrBadGrant, "sealed object's policy is not the one its signer, policy ref and counter describe")
}

// TestUnsealRefusesRedefinedCounter deletes the grant counter (the owner
// can) and puts back first an ordinary index holding the sealed value,
// then a counter of the same shape: neither opens the sealed key.
func TestUnsealRefusesRedefinedCounter(t *testing.T) {
	m := newMachine(t, 3, 24)
	undefine(t, m.sim)
	_, _, err := m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrWithdrawn, "grant counter 0x1384c4b is gone")

	with(t, m.sim, func(tp transport.TPM) error {
		pub := counterPublic(GrantCounterIndex, false)
		pub.Attributes.NT = tpm2.TPMNTOrdinary
		if _, err := (tpm2.NVDefineSpace{
			AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			PublicInfo: tpm2.New2B(pub),
		}).Execute(tp); err != nil {
			t.Fatal(err)
		}
		pub.Attributes.Written = true
		name, _ := tpm2.NVName(&pub)
		nv := tpm2.NamedHandle{Handle: tpm2.TPMHandle(GrantCounterIndex), Name: *name}
		if _, err := (tpm2.NVWrite{
			AuthHandle: tpm2.AuthHandle{Handle: nv.Handle, Name: nv.Name, Auth: tpm2.PasswordAuth(nil)},
			NVIndex:    nv,
			Data:       tpm2.TPM2BMaxNVBuffer{Buffer: counterOperand(m.sealed.Counter)},
		}).Execute(tp); err != nil {
			t.Fatal(err)
		}
		return nil
	})
	_, _, err = m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrWithdrawn, "grant counter 0x1384c4b was redefined")

	undefine(t, m.sim)
	// Sealing again defines a counter of the right shape; it starts above
	// every value the old one held.
	m2 := with(t, m.sim, func(tp transport.TPM) *Sealed {
		s, err := Seal(tp, m.key, m.grant)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
	if m2.Counter <= m.sealed.Counter {
		t.Fatalf("redefined counter at %d, old sealed at %d", m2.Counter, m.sealed.Counter)
	}
	_, _, err = m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrWithdrawn, "sealed at 1")
	if key, _, err := m.unseal(t, m2, m.grant); err != nil || !bytes.Equal(key, m.key) {
		t.Fatalf("the new seal: %v", err)
	}
}

// TestFreshGrantRenewsWithoutReseal: a grant from a later attestation
// opens the same sealed key after the first one is spent.
func TestFreshGrantRenewsWithoutReseal(t *testing.T) {
	m := newMachine(t, 1, 24)
	reboot(t, m.sim)
	reboot(t, m.sim)
	_, _, err := m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrBootsSpent, "boot 2 since the grant, 1 allowed")

	fresh := m.grantNow(t, 1, 24) // re-attestation in this boot
	if fresh.ResetCount != m.grant.ResetCount+2 {
		t.Fatalf("fresh grant reset count %d, want %d", fresh.ResetCount, m.grant.ResetCount+2)
	}
	if st := m.mustUnseal(t, fresh); st.Boot != 0 {
		t.Errorf("status %+v, want boot 0 (the granting boot)", st)
	}
	reboot(t, m.sim)
	if st := m.mustUnseal(t, fresh); st.Boot != 1 {
		t.Errorf("status %+v, want boot 1", st)
	}
}

func TestUnsealRefusesOnAnotherTPM(t *testing.T) {
	m := newMachine(t, 3, 24)
	other := tpmtest.StartFresh(t)
	boot(t, other)
	o := &machine{sim: other}
	_, _, err := o.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrWithdrawn, "the sealed key is not this TPM's")
}

func TestUnsealRefusesForeignSigner(t *testing.T) {
	m := newMachine(t, 3, 24)
	foreign := testAuthorizer(t, testSecret(2))
	g, err := foreign.Grant(grantRequest(m.grant))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = m.unseal(t, m.sealed, g)
	refused(t, err, ErrBadGrant, "the grant's signer is not the sealed key's")

	// Slipping past it: the token's signer edited to the foreign key's.
	_, _, name, _, _ := checkGrant(g)
	edited := *m.sealed
	edited.Signer = name
	_, _, err = m.unseal(t, &edited, g)
	refused(t, err, ErrBadGrant, "sealed object's policy is not the one its signer")

	// ... and the object's policy too: the TPM's integrity check refuses.
	pub, _ := tpm2.Unmarshal[tpm2.TPM2BPublic](m.sealed.Public)
	c, _ := pub.Contents()
	nvName, _ := counterName(GrantCounterIndex)
	c.AuthPolicy.Buffer = sealPolicy(name, edited.PolicyRef, nvName, edited.Counter)
	edited.Public = tpm2.Marshal(tpm2.New2B(*c))
	_, _, err = m.unseal(t, &edited, g)
	refused(t, err, ErrWithdrawn, "its storage root key refuses it")
}

// TestUnsealRefusesEditedGrant edits each field an attacker holding the
// token controls, keeping the verifier's signature, to values that would
// let a spent grant open.
func TestUnsealRefusesEditedGrant(t *testing.T) {
	m := newMachine(t, 1, 1)
	reboot(t, m.sim)
	reboot(t, m.sim)
	clockSet(t, m.sim, m.grant.ClockMs+2*msPerHour)
	m.sim.Extend(t, bootPCR, []byte("another uki"))
	now := attest(t, m.sim, 1, 1)
	for _, tc := range []struct {
		field  string
		edit   func(*latchkeyv1.OfflineGrant)
		detail string
	}{
		{"pcrs", func(g *latchkeyv1.OfflineGrant) { g.Pcrs = now.PCRs }, "signature does not cover this grant"},
		{"reset_count", func(g *latchkeyv1.OfflineGrant) { g.ResetCount = now.ResetCount }, "signature does not cover this grant"},
		{"clock_ms", func(g *latchkeyv1.OfflineGrant) { g.ClockMs = now.ClockMS }, "signature does not cover this grant"},
		{"max_boots", func(g *latchkeyv1.OfflineGrant) { g.MaxBoots = MaxBootsLimit }, "signature does not cover this grant"},
		{"max_hours", func(g *latchkeyv1.OfflineGrant) { g.MaxHours = MaxHoursLimit }, "signature does not cover this grant"},
		{"policy_ref", func(g *latchkeyv1.OfflineGrant) { g.PolicyRef = PolicyRef([]byte("other"), "disk") }, "policy ref differs"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			g := cloneGrant(m.grant)
			tc.edit(g)
			_, _, err := m.unseal(t, m.sealed, g)
			refused(t, err, ErrBadGrant, tc.detail)
		})
	}
	// The policy ref edited in the token as well: the token's own policy
	// no longer matches it.
	g := cloneGrant(m.grant)
	g.PolicyRef = PolicyRef([]byte("other"), "disk")
	edited := *m.sealed
	edited.PolicyRef = g.PolicyRef
	_, _, err := m.unseal(t, &edited, g)
	refused(t, err, ErrBadGrant, "sealed object's policy is not the one")
}

func TestWithdrawWithoutCounterIsNoop(t *testing.T) {
	m := newMachine(t, 3, 24)
	undefine(t, m.sim)
	with(t, m.sim, func(tp transport.TPM) error {
		if err := Withdraw(tp, m.sealed); err != nil {
			t.Fatalf("withdraw of a gone counter: %v", err)
		}
		return nil
	})
	_, _, err := m.unseal(t, m.sealed, m.grant)
	refused(t, err, ErrWithdrawn, "is gone")
}

// undefine deletes the grant counter with owner authorization.
func undefine(t testing.TB, sim *tpmtest.Simulator) {
	t.Helper()
	with(t, sim, func(tp transport.TPM) error {
		rsp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(GrantCounterIndex)}.Execute(tp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := (tpm2.NVUndefineSpace{
			AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			NVIndex:    tpm2.NamedHandle{Handle: tpm2.TPMHandle(GrantCounterIndex), Name: rsp.NVName},
		}).Execute(tp); err != nil {
			t.Fatal(err)
		}
		return nil
	})
}

// clockSet advances the TPM's clock with TPM2_ClockSet (owner
// authorization; go-tpm lacks the command). The TPM never moves it back.
func clockSet(t testing.TB, sim *tpmtest.Simulator, ms uint64) {
	t.Helper()
	with(t, sim, func(tp transport.TPM) error {
		cmd := binary.BigEndian.AppendUint16(nil, uint16(tpm2.TPMSTSessions))
		cmd = binary.BigEndian.AppendUint32(cmd, 10+4+4+9+8)
		cmd = binary.BigEndian.AppendUint32(cmd, uint32(tpm2.TPMCCClockSet))
		cmd = binary.BigEndian.AppendUint32(cmd, uint32(tpm2.TPMRHOwner))
		cmd = binary.BigEndian.AppendUint32(cmd, 9) // authorization area size
		cmd = binary.BigEndian.AppendUint32(cmd, uint32(tpm2.TPMRSPW))
		cmd = append(cmd, 0, 0, 1, 0, 0) // empty nonce, continueSession, empty password
		cmd = binary.BigEndian.AppendUint64(cmd, ms)
		rsp, err := tp.Send(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if rc := tpm2.TPMRC(binary.BigEndian.Uint32(rsp[6:10])); rc != tpm2.TPMRCSuccess {
			t.Fatalf("ClockSet: %v", rc)
		}
		return nil
	})
}
