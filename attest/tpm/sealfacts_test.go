package tpm_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// The quote's TPMS_CLOCK_INFO is signed with it: the state carries it as
// quoted, and the grant's PCRs are the quoted ones.
func TestStateCarriesQuotedClock(t *testing.T) {
	der, _ := dbCert(t, "test db")
	m := boot(t, ukiBoot(t, der), sysinit)
	clk := tpm2.TPMSClockInfo{Clock: 123456789, ResetCount: 42, RestartCount: 3, Safe: true}
	st, err := m.validate(t, nil, func(o *craftOpts) { o.clock = clk })
	if err != nil {
		t.Fatal(err)
	}
	if want := (tpm.Clock{ClockMS: 123456789, ResetCount: 42, RestartCount: 3, Safe: true}); st.Clock != want {
		t.Fatalf("clock = %+v, want %+v", st.Clock, want)
	}
	pcrs, err := st.SealPCRs(true)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range st.PCRs {
		if !bytes.Equal(pcrs[uint32(i)], v[:]) {
			t.Errorf("pcr %d = %x, quoted %x", i, pcrs[uint32(i)], v)
		}
	}
	if len(pcrs) != len(st.PCRs) {
		t.Fatalf("%d pcrs, the quote %d", len(pcrs), len(st.PCRs))
	}
	f, err := st.SealFacts(true)
	if err != nil {
		t.Fatal(err)
	}
	if f.ResetCount != 42 || f.ClockMS != 123456789 || len(f.PCRs) != len(st.PCRs) {
		t.Fatalf("facts: reset count %d, clock %d, %d pcrs", f.ResetCount, f.ClockMS, len(f.PCRs))
	}
}

// A re-attestation quotes PCR 11 at "…:sysinit:ready"; the grant must
// carry its value at the join point ("…:sysinit"), where the next boot
// unseals. The value is replayed from the logs whether systemd logged the
// phase words or left them unlogged (systemd 252), and equals what a join
// at that point quotes.
func TestSealFactsPCR11AtJoinPoint(t *testing.T) {
	der, _ := dbCert(t, "test db")
	joinAt := boot(t, ukiBoot(t, der), sysinit)
	want := joinAt.pcrs[11]
	phaseRecords := func(words ...string) []tpmtest.SystemdRecord {
		var out []tpmtest.SystemdRecord
		for _, w := range words {
			out = append(out, tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: w})
		}
		return out
	}
	cases := map[string]*machine{
		"join, unlogged":       joinAt,
		"reattest, unlogged":   boot(t, ukiBoot(t, der), sysinit+":ready"),
		"reattest, logged":     boot(t, ukiBoot(t, der), "", phaseRecords("enter-initrd", "leave-initrd", "sysinit", "ready")...),
		"reattest, past ready": boot(t, ukiBoot(t, der), "", phaseRecords("enter-initrd", "leave-initrd", "sysinit", "ready", "shutdown")...),
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			st, err := m.validate(t, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Boot.PCR11AtJoinKnown || st.Boot.PCR11AtJoin != want {
				t.Fatalf("join point %x (known %v), want %x", st.Boot.PCR11AtJoin, st.Boot.PCR11AtJoinKnown, want)
			}
			pcrs, err := st.SealPCRs(false)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(pcrs[11], want[:]) {
				t.Fatalf("pcr 11 = %x, want the join point %x", pcrs[11], want)
			}
		})
	}
}

// A PCR 11 that never passed "sysinit" has no join-point value: no grant,
// with the reason. A UKI section whose contents are "sysinit" is not a
// phase word and does not count as one.
func TestSealFactsNoJoinPoint(t *testing.T) {
	der, _ := dbCert(t, "test db")
	for name, m := range map[string]*machine{
		"before sysinit": boot(t, ukiBoot(t, der), "enter-initrd:leave-initrd"),
		"sysinit section": boot(t, tpmtest.Boot{Firmware: "EDK II", SecureBoot: true, DB: [][]byte{der},
			Loaders: [][32]byte{loaderDigest}, UKI: ukiDigest, Sections: []tpmtest.Section{{Name: ".linux", Data: []byte("sysinit")}}}, ""),
	} {
		t.Run(name, func(t *testing.T) {
			st, err := m.validate(t, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = st.SealPCRs(true)
			want := `pcr 11 never passed the "sysinit" phase word (phase "` + st.Boot.Phase + `"), so its join-point value is unknown`
			if err == nil || err.Error() != want {
				t.Fatalf("err = %v, want %q", err, want)
			}
		})
	}
}

// Without event logs the quoted PCR 11 is the join point only when the
// caller knows the quote was made there (a join); a re-attestation gets
// no grant.
func TestSealFactsWithoutLogs(t *testing.T) {
	ak := newCrafted(t, true)
	pcrs := map[int][32]byte{7: {7}, 11: {11}}
	binding := newBinding(t)
	v := newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{ak.akHash}})
	ver, err := attest.Validate(context.Background(), v, ak.evidenceWith(t, binding, craftOpts{pcrs: pcrs}), binding, noRoundTrip(t))
	if err != nil {
		t.Fatal(err)
	}
	st := stateOf(t, ver)
	got, err := st.SealPCRs(true)
	if err != nil {
		t.Fatal(err)
	}
	if q := pcrs[11]; hex.EncodeToString(got[11]) != hex.EncodeToString(q[:]) {
		t.Fatalf("pcr 11 = %x", got[11])
	}
	_, err = st.SealPCRs(false)
	if want := "the evidence carries no event log to derive pcr 11's join-point value from"; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
}

// A real TPM's quote by latchkey's AK (an endorsement-hierarchy primary)
// carries the TPM's own resetCount, the one TPM2_ReadClock reports and
// PolicyCounterTimer compares; an owner-hierarchy key's quote of the same
// TPM carries an obfuscated one, which a boot bound cannot count from.
func TestSwtpmQuotedResetCountIsTheTPMs(t *testing.T) {
	m := newMeasuredSwtpm(t)
	st, err := m.join(t, m.policy())
	if err != nil {
		t.Fatal(err)
	}
	tp, err := tpm.OpenDevice(m.sim.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	now, err := tpm2.ReadClock{}.Execute(tp)
	if err != nil {
		t.Fatal(err)
	}
	real := now.CurrentTime.ClockInfo
	if st.Clock.ResetCount != real.ResetCount {
		t.Fatalf("quoted resetCount %d, the TPM's %d", st.Clock.ResetCount, real.ResetCount)
	}
	if st.Clock.ClockMS == 0 || st.Clock.ClockMS > real.Clock {
		t.Fatalf("quoted clock %d, tpm clock now %d", st.Clock.ClockMS, real.Clock)
	}
	f, err := st.SealFacts(true)
	if err != nil || f.ResetCount != real.ResetCount {
		t.Fatalf("SealFacts: reset count %d, %v", f.ResetCount, err)
	}
	if got := ownerQuoteResetCount(t, tp); got == real.ResetCount {
		t.Fatalf("an owner-hierarchy key's quote carries the real resetCount %d: not obfuscated", got)
	}
}

// ownerQuoteResetCount quotes with a key like the AK made in the owner
// hierarchy and returns the resetCount the quote carries.
func ownerQuoteResetCount(t *testing.T, tp transport.TPM) uint32 {
	t.Helper()
	ak := tpm.AKTemplateForTest()
	cp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(ak),
	}.Execute(tp)
	if err != nil {
		t.Fatal(err)
	}
	defer tpm2.FlushContext{FlushHandle: cp.ObjectHandle}.Execute(tp) //nolint:errcheck // test cleanup
	q, err := tpm2.Quote{
		SignHandle: tpm2.AuthHandle{Handle: cp.ObjectHandle, Name: cp.Name, Auth: tpm2.PasswordAuth(nil)},
		InScheme:   tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
		PCRSelect:  tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{Hash: tpm2.TPMAlgSHA256, PCRSelect: []byte{1, 0, 0}}}},
	}.Execute(tp)
	if err != nil {
		t.Fatal(err)
	}
	att, err := q.Quoted.Contents()
	if err != nil {
		t.Fatal(err)
	}
	return att.ClockInfo.ResetCount
}
