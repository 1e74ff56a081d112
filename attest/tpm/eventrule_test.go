package tpm_test

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// unexplained is the refusal detail of a measurement the policy cannot
// read.
func unexplained(pcr, index int, digest [32]byte) string {
	return fmt.Sprintf("pcr %d: measurement %d (%s) is neither content-verified nor explained by the policy (boot.extraMeasurements)", pcr, index, dgst(digest))
}

// withLogs is an edit of craftOpts carrying l.
func withLogs(l logs) func(*craftOpts) {
	return func(o *craftOpts) {
		o.fw, o.sd = l.fwBytes(), nil
		if len(l.sd) > 0 {
			o.sd = l.sdBytes()
		}
	}
}

// A machine stopped in the initrd (PCR 11: the stub's sections and
// "enter-initrd") whose UKI is signed for every phase rewrites the content
// of its one phase record to the phases the policy accepts, leaving the
// digest: PCR 11 still replays, and the phase used to be read from the
// rewritten words. The record is now unexplained (PCR 11's eight stub
// events come first, so it is measurement 9). The inputs built to slip
// past: the same rewrite carried in the firmware log, relabelled as
// another event type, and a policy that allow-lists the digest, which
// explains the record but never lets its content speak.
func TestPhaseContentRewriteIsRefused(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	sg := newSigner(t)
	m := boot(t, ukiBoot(t, der), "", tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "enter-initrd"})
	base := tpmtest.OVMFLog(ukiBoot(t, der)).PCRs
	var values [][32]byte
	for i := range 4 {
		p := map[int][32]byte{11: base[11]}
		tpmtest.ExtendPhase(p, joinPhases(i+1))
		values = append(values, p[11])
	}
	m.sig = sg.sign(t, values...)
	bp := &tpm.BootPolicy{BootLoaders: []string{dgst(loaderDigest)}, PCR11Signers: []string{sg.pem},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	honest := parseLogs(t, m.log.Bytes(), m.sd)
	enterInitrd := sha256.Sum256([]byte("enter-initrd"))

	_, err := m.validate(t, bp, nil)
	wantRefusal(t, err, latchkeyv1.Reason_PCR_SIGNATURE_INVALID, fmt.Sprintf(`uki %s: pcr 11 is in boot phase "enter-initrd", the policy accepts`, dgst(ukiDigest)))

	rewritten := honest.clone()
	rewritten.sd[0].str = sysinit
	_, err = m.validate(t, bp, withLogs(rewritten))
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, unexplained(11, 9, enterInitrd))

	relabelled := rewritten.clone()
	relabelled.sd[0].typ = "machine-id"
	_, err = m.validate(t, bp, withLogs(relabelled))
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, unexplained(11, 9, enterInitrd))

	for _, data := range [][]byte{[]byte(sysinit), tpmtest.UTF16(sysinit)} {
		moved := honest.clone()
		moved.sd = nil
		moved.fw = append(moved.fw, fwEvent{pcr: 11, typ: tpmtest.EvIPL, data: data, digest: enterInitrd})
		_, err = m.validate(t, bp, withLogs(moved))
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, unexplained(11, 9, enterInitrd))
	}

	allowed := *bp
	allowed.ExtraMeasurements = []string{dgst(enterInitrd)}
	_, err = m.validate(t, &allowed, withLogs(rewritten))
	wantRefusal(t, err, latchkeyv1.Reason_PCR_SIGNATURE_INVALID, fmt.Sprintf(`uki %s: pcr 11 is in boot phase "", the policy accepts`, dgst(ukiDigest)))
}

func joinPhases(n int) string { return strings.Join(bootlog.StandardPhases[:n], ":") }

// A boot loader passed init=/bin/sh; the machine rewrites the data of its
// PCR 12 command-line event, leaving the digest, and the command line
// used to vanish from the policy's view. The event is now unexplained.
// The inputs built to slip past: the rewrite moved to systemd's log;
// the honest data under another event type (still the command line, by
// content); the honest data moved to systemd's log (the same).
func TestCmdlineDataRewriteIsRefused(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	initSh := ukiBoot(t, der)
	initSh.Cmdline, initSh.Passed = "console=ttyS0 init=/bin/sh", true
	m := boot(t, initSh, sysinit)
	bp := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, BootLoaders: []string{dgst(loaderDigest)},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	honest := parseLogs(t, m.log.Bytes(), nil)
	i := slices.IndexFunc(honest.fw, func(e fwEvent) bool { return e.pcr == 12 })
	cmdline := honest.fw[i].digest
	const refused = `kernel command line "console=ttyS0 init=/bin/sh" in pcr 12 is not allowed`

	_, err := m.validate(t, bp, nil)
	wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, refused)

	rewritten := honest.clone()
	rewritten.fw[i].data = tpmtest.UTF16("console=ttyS0")
	_, err = m.validate(t, bp, withLogs(rewritten))
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, unexplained(12, 1, cmdline))

	toSystemd := honest.clone()
	toSystemd.fw = slices.Delete(toSystemd.fw, i, i+1)
	toSystemd.sd = []sdRecord{{pcr: 12, digest: cmdline, str: "console=ttyS0", typ: "stub"}}
	_, err = m.validate(t, bp, withLogs(toSystemd))
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, unexplained(12, 1, cmdline))

	relabelled := honest.clone()
	relabelled.fw[i].typ = 0x06 // EV_EVENT_TAG
	_, err = m.validate(t, bp, withLogs(relabelled))
	wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, refused)

	toSystemd.sd[0].str = string(honest.fw[i].data)
	_, err = m.validate(t, bp, withLogs(toSystemd))
	wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, refused)
}

// An application relabelled as an EFI action (or its data rewritten to
// the "Calling EFI Application" text) is still an application: PCR 4 is
// read by digest.
func TestApplicationRelabelIsStillJudged(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	b := ukiBoot(t, der)
	grub := sha256.Sum256([]byte("grub"))
	b.Loaders = [][32]byte{grub, loaderDigest}
	m := boot(t, b, sysinit)
	bp := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, BootLoaders: []string{dgst(loaderDigest)},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	honest := parseLogs(t, m.log.Bytes(), nil)
	i := slices.IndexFunc(honest.fw, func(e fwEvent) bool { return e.digest == grub })
	want := "boot loader " + dgst(grub) + " in pcr 4 is not allowed"
	_, err := m.validate(t, bp, nil)
	wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, want)
	for _, typ := range []uint32{tpmtest.EvEFIAction, tpmtest.EvSeparator, tpmtest.EvIPL} {
		l := honest.clone()
		l.fw[i].typ, l.fw[i].data = typ, []byte("Calling EFI Application from Boot Option")
		_, err := m.validate(t, bp, withLogs(l))
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, want)
	}
}

// A measurement in PCR 12 the verifier cannot read (a systemd-stub
// credential: its digest is the file's, its data a name) refuses the
// machine until the policy lists its digest in extraMeasurements.
func TestExtraMeasurementsExplainByDigest(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	l := tpmtest.OVMFLog(ukiBoot(t, der))
	cred := sha256.Sum256([]byte("credential contents"))
	l.Add(12, tpmtest.EvIPL, tpmtest.UTF16("some.cred"), cred)
	m := boot(t, ukiBoot(t, der), sysinit)
	m.log, m.pcrs[12] = l, l.PCRs[12]
	bp := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, BootLoaders: []string{dgst(loaderDigest)},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	_, err := m.validate(t, bp, nil)
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, unexplained(12, 1, cred))
	bp.ExtraMeasurements = []string{dgst(cred)}
	st, err := m.validate(t, bp, nil)
	if err != nil {
		t.Fatalf("allow-listed measurement refused: %v", err)
	}
	if st.Boot.CmdlinePassed || len(st.Boot.Unexplained) != 1 {
		t.Fatalf("boot = %+v", st.Boot)
	}
}

// machineFrom is a machine whose firmware log is l's events (their PCR
// values quoted) and whose PCR 11 then holds the unlogged phase.
func machineFrom(t *testing.T, l logs, phase string) *machine {
	t.Helper()
	fw := tpmtest.NewFirmwareLog()
	for _, e := range l.fw {
		fw.Add(e.pcr, e.typ, e.data, e.digest)
	}
	m := &machine{ak: newCrafted(t, true), log: fw, pcrs: maps.Clone(fw.PCRs)}
	tpmtest.ExtendPhase(m.pcrs, phase)
	return m
}

// QEMU's -kernel path under OVMF: the firmware loads (and measures) the
// UKI before it measures "Calling EFI Application", then systemd-stub
// loads the kernel. One boot attempt: the UKI is admitted with its
// payload, and the command line the firmware passed is judged by name.
func TestKernelLoadedBeforeReadyToBoot(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	b := ukiBoot(t, der)
	b.Loaders = nil
	b.Cmdline, b.Passed = "console=ttyS0 systemd.debug_shell=1", true
	l := parseLogs(t, tpmtest.OVMFLog(b).Bytes(), nil)
	calling := slices.IndexFunc(l.fw, func(e fwEvent) bool { return e.pcr == 4 && e.typ == tpmtest.EvEFIAction })
	uki := slices.IndexFunc(l.fw, func(e fwEvent) bool { return e.digest == ukiDigest })
	e := l.fw[uki]
	l.fw = slices.Insert(slices.Delete(l.fw, uki, uki+1), calling, e)
	kernel := sha256.Sum256([]byte("kernel authenticode"))
	l.fw = append(l.fw, fwEvent{pcr: 4, typ: tpmtest.EvEFIBootApp, data: make([]byte, 32), digest: kernel})
	m := machineFrom(t, l, sysinit)
	bp := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	_, err := m.validate(t, bp, nil)
	wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, `kernel command line "console=ttyS0 systemd.debug_shell=1" in pcr 12 is not allowed`)
}

// An application from a boot attempt that returned is not the UKI's
// payload: it must be a listed boot loader, wherever it sits.
func TestFailedBootAttemptIsJudged(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	b := ukiBoot(t, der)
	b.Loaders = nil
	l := parseLogs(t, tpmtest.OVMFLog(b).Bytes(), nil)
	uki := slices.IndexFunc(l.fw, func(e fwEvent) bool { return e.digest == ukiDigest })
	shell := sha256.Sum256([]byte("efi shell"))
	returning := []byte("Returning from EFI Application from Boot Option")
	calling := []byte("Calling EFI Application from Boot Option")
	l.fw = slices.Insert(l.fw, uki+1,
		fwEvent{pcr: 4, typ: tpmtest.EvEFIAction, data: returning, digest: sha256.Sum256(returning)},
		fwEvent{pcr: 4, typ: tpmtest.EvEFIAction, data: calling, digest: sha256.Sum256(calling)},
		fwEvent{pcr: 4, typ: tpmtest.EvEFIBootApp, data: make([]byte, 32), digest: shell})
	m := machineFrom(t, l, sysinit)
	bp := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	_, err := m.validate(t, bp, nil)
	wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "boot loader "+dgst(shell)+" in pcr 4 is not allowed")
	bp.BootLoaders = []string{dgst(shell)}
	if _, err := m.validate(t, bp, nil); err != nil {
		t.Fatalf("listed boot loader in a later attempt refused: %v", err)
	}
}
