package tpm_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/google/go-tpm/tpm2"

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
	// Whatever the quote says, its reset count is not the TPM's.
	if _, err := st.SealFacts(true); !errors.Is(err, tpm.ErrResetCountObfuscated) {
		t.Fatalf("SealFacts: %v, want ErrResetCountObfuscated", err)
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

// A real TPM's quote by latchkey's AK (an owner-hierarchy primary)
// carries an obfuscated resetCount: not the count TPM2_ReadClock reports,
// while the clock is the TPM's. This is why SealFacts builds no grant.
func TestSwtpmQuotedResetCountIsObfuscated(t *testing.T) {
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
	if st.Clock.ResetCount == real.ResetCount {
		t.Fatalf("quoted resetCount %d is the TPM's: the quote is not obfuscated", real.ResetCount)
	}
	if st.Clock.ClockMS == 0 || st.Clock.ClockMS > real.Clock {
		t.Fatalf("quoted clock %d, tpm clock now %d", st.Clock.ClockMS, real.Clock)
	}
	if _, err := st.SealFacts(true); !errors.Is(err, tpm.ErrResetCountObfuscated) {
		t.Fatalf("SealFacts: %v", err)
	}
}
