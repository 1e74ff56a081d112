package tpm_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/pkitest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

const sysinit = "enter-initrd:leave-initrd:sysinit"

var (
	loaderDigest = sha256.Sum256([]byte("systemd-boot"))
	ukiDigest    = sha256.Sum256([]byte("uki v1"))
)

func dgst(d [32]byte) string { return "sha256:" + hex.EncodeToString(d[:]) }

// testSections are a small UKI's sections, as systemd-stub measures them.
func testSections(linux string) []tpmtest.Section {
	return []tpmtest.Section{
		{Name: ".linux", Data: []byte(linux)},
		{Name: ".osrel", Data: []byte("ID=debian\n")},
		{Name: ".cmdline", Data: []byte("console=ttyS0 ro")},
		{Name: ".initrd", Data: []byte("initrd")},
	}
}

// dbCert is a Secure Boot db certificate for the synthesized logs.
func dbCert(t testing.TB, cn string) (der []byte, pemText string) {
	t.Helper()
	c := pkitest.SelfSigned(t, cn)
	return c.DER(), string(c.PEM())
}

// machine is a synthesized booted machine: its log, its quoted PCRs and
// the crafted AK that quotes them.
type machine struct {
	ak   *crafted
	log  *tpmtest.FirmwareLog
	pcrs map[int][32]byte
	sd   []byte
	sig  []byte
	raw  []byte // the firmware log as the machine wrote it, when log re-encodes it
}

// boot synthesizes an OVMF boot of b and, when records is nil, the
// unlogged systemd 252 phase words of phase; otherwise the systemd log.
func boot(t testing.TB, b tpmtest.Boot, phase string, records ...tpmtest.SystemdRecord) *machine {
	t.Helper()
	l := tpmtest.OVMFLog(b)
	m := &machine{ak: newCrafted(t, true), log: l, pcrs: maps.Clone(l.PCRs)}
	if records != nil {
		m.sd = tpmtest.SystemdLog(m.pcrs, records...)
	} else {
		tpmtest.ExtendPhase(m.pcrs, phase)
	}
	return m
}

func (m *machine) evidence(t testing.TB, binding []byte) []byte {
	return m.ak.evidenceWith(t, binding, craftOpts{pcrs: m.pcrs, fw: m.log.Bytes(), sd: m.sd, sig: m.sig})
}

func (m *machine) validate(t *testing.T, bp *tpm.BootPolicy, edit func(*craftOpts)) (*tpm.State, error) {
	t.Helper()
	o := craftOpts{pcrs: m.pcrs, sd: m.sd, sig: m.sig}
	if m.log != nil {
		o.fw = m.log.Bytes()
	}
	if edit != nil {
		edit(&o)
	}
	binding := newBinding(t)
	v := newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{m.ak.akHash}, Boot: bp})
	ver, err := attest.Validate(context.Background(), v, m.ak.evidenceWith(t, binding, o), binding, noRoundTrip(t))
	if err != nil {
		return nil, err
	}
	return stateOf(t, ver), nil
}

// signer signs PCR 11 values the way `systemd-measure sign` does
// (TestSignatureFormatMatchesSystemdMeasure pins the format).
type signer struct {
	key *rsa.PrivateKey
	pem string
	fp  [32]byte
}

func newSigner(t testing.TB) *signer {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256(x509.MarshalPKCS1PublicKey(&k.PublicKey)) // systemd's pkfp
	return &signer{key: k, pem: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), fp: fp}
}

// sign writes the signature JSON for PCR 11 holding each of values.
func (s *signer) sign(t testing.TB, values ...[32]byte) []byte {
	t.Helper()
	type entry struct {
		PCRs []int  `json:"pcrs"`
		PKFP string `json:"pkfp"`
		Pol  string `json:"pol"`
		Sig  string `json:"sig"`
	}
	var entries []entry
	for _, v := range values {
		pol := tpm.PolicyPCRDigest(v)
		h := sha256.Sum256(pol[:])
		sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA256, h[:])
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, entry{[]int{11}, hex.EncodeToString(s.fp[:]), hex.EncodeToString(pol[:]), base64.StdEncoding.EncodeToString(sig)})
	}
	out, err := json.Marshal(map[string][]entry{"sha256": entries})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func ukiBoot(t testing.TB, dbDER []byte) tpmtest.Boot {
	return tpmtest.Boot{Firmware: "EDK II", SecureBoot: true, DB: [][]byte{dbDER},
		Loaders: [][32]byte{loaderDigest}, UKI: ukiDigest, Sections: testSections("kernel v1")}
}

// A boot that replays yields the typed state the policy reads, and a
// policy listing its components admits it.
func TestBootLogVerifiedState(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	m := boot(t, ukiBoot(t, der), sysinit)
	st, err := m.validate(t, &tpm.BootPolicy{
		UKIs: []string{dgst(ukiDigest)}, BootLoaders: []string{dgst(loaderDigest)},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}},
	}, nil)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	b := st.Boot
	if b == nil || len(b.Unexplained) != 0 {
		t.Fatalf("boot = %+v", b)
	}
	if !b.SecureBoot.Enabled || len(b.SecureBoot.DB) != 1 || string(b.SecureBoot.DB[0].Raw) != string(der) {
		t.Fatalf("secure boot = %+v", b.SecureBoot)
	}
	want := []bootlog.Application{{Digest: loaderDigest, Attempt: 1}, {Digest: ukiDigest, Attempt: 1}}
	if fmt.Sprint(b.Applications) != fmt.Sprint(want) {
		t.Fatalf("applications = %v, want %v", b.Applications, want)
	}
	var names []string
	for _, s := range b.UKISections {
		names = append(names, s.Name)
	}
	if strings.Join(names, " ") != ".linux .osrel .cmdline .initrd" || b.UKISections[0].Digest != sha256.Sum256([]byte("kernel v1")) {
		t.Fatalf("sections = %v", b.UKISections)
	}
	if !b.PhaseKnown || b.Phase != sysinit || b.CmdlinePassed {
		t.Fatalf("phase %q known %v cmdline passed %v", b.Phase, b.PhaseKnown, b.CmdlinePassed)
	}
}

// A systemd 254+ userspace log carries the phase words and other
// measurements; the joint replay names the phase from the log.
func TestSystemdLogReplays(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	m := boot(t, ukiBoot(t, der), "",
		tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "enter-initrd"},
		tpmtest.SystemdRecord{PCR: 15, EventType: "machine-id", String: "machine-id:0123"},
		tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "leave-initrd"},
		tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "sysinit"},
	)
	bp := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, BootLoaders: []string{dgst(loaderDigest)},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	st, err := m.validate(t, bp, nil)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if st.Boot.Phase != sysinit || len(st.Boot.Unexplained) != 0 {
		t.Fatalf("boot = %+v", st.Boot)
	}
	// The same log with one phase string edited after the quote.
	_, err = m.validate(t, bp, func(o *craftOpts) {
		edited := tpmtest.SystemdLog(map[int][32]byte{}, tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "enter-initrd"},
			tpmtest.SystemdRecord{PCR: 15, EventType: "machine-id", String: "machine-id:0123"},
			tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "leave-initrd"},
			tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "ready"})
		o.sd = edited
	})
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "pcr 11: event logs replay to ")
}

// wantRefusal checks the reason and that the detail starts with prefix.
func wantRefusal(t *testing.T, err error, want latchkeyv1.Reason, prefix string) {
	t.Helper()
	wantReason(t, err, want)
	var r *attest.Refusal
	if !asRefusal(err, &r) || !strings.HasPrefix(r.Detail, prefix) {
		t.Fatalf("detail = %v, want prefix %q", err, prefix)
	}
}

func asRefusal(err error, r **attest.Refusal) bool {
	rr, ok := err.(*attest.Refusal)
	*r = rr
	return ok
}

func hx(d [32]byte) string { return hex.EncodeToString(d[:]) }

// Every refusal of replay and of the component policy, each with its
// exact reason and message.
func TestBootRefusals(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	_, otherPEM := dbCert(t, "other db")
	sg, stranger := newSigner(t), newSigner(t)
	pinned := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, BootLoaders: []string{dgst(loaderDigest)},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	signed := &tpm.BootPolicy{BootLoaders: []string{dgst(loaderDigest)}, PCR11Signers: []string{sg.pem},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}

	good := boot(t, ukiBoot(t, der), sysinit)
	edited := ukiBoot(t, der)
	edited.UKI = sha256.Sum256([]byte("uki v2"))
	edited.Sections = testSections("kernel v2")
	editedLog := tpmtest.OVMFLog(edited)

	truncated := good.log.Bytes()
	// The good log without its last event (Exit Boot Services in PCR 5:
	// a 12-byte header, the algorithm, the digest, the size, the data).
	cut := truncated[:len(truncated)-(12+2+32+4+len("Exit Boot Services Invocation"))]
	extra := tpmtest.OVMFLog(ukiBoot(t, der))
	extra.Add(4, tpmtest.EvEFIBootApp, make([]byte, 32), sha256.Sum256([]byte("extra")))
	unquoted := tpmtest.OVMFLog(ukiBoot(t, der))
	unquoted.AddData(16, tpmtest.EvIPL, []byte("debug"))

	otherUKI := boot(t, ukiBoot(t, der), sysinit)
	otherUKI.log = editedLog
	otherUKI.pcrs = maps.Clone(editedLog.PCRs)
	tpmtest.ExtendPhase(otherUKI.pcrs, sysinit)

	dup := ukiBoot(t, der)
	dup.Sections = append(dup.Sections, tpmtest.Section{Name: ".cmdline", Data: []byte("init=/bin/sh")})

	sbOff := ukiBoot(t, der)
	sbOff.SecureBoot = false
	passed := ukiBoot(t, der)
	passed.Cmdline, passed.Passed = "console=ttyS0 init=/bin/sh", true
	noLoader := ukiBoot(t, der)
	noLoader.Loaders = [][32]byte{sha256.Sum256([]byte("grub"))}

	initrd := boot(t, ukiBoot(t, der), "enter-initrd")
	initrd.sig = sg.sign(t, initrd.pcrs[11])
	signedOK := boot(t, ukiBoot(t, der), sysinit)
	signedOK.sig = sg.sign(t, signedOK.pcrs[11])
	byStranger := boot(t, ukiBoot(t, der), sysinit)
	byStranger.sig = stranger.sign(t, byStranger.pcrs[11])
	otherValue := boot(t, ukiBoot(t, der), sysinit)
	otherValue.sig = sg.sign(t, otherUKI.pcrs[11])
	unsigned := boot(t, ukiBoot(t, der), sysinit)

	cases := []struct {
		name   string
		m      *machine
		bp     *tpm.BootPolicy
		edit   func(*craftOpts)
		reason latchkeyv1.Reason
		detail string
	}{
		{"log edited after the quote", good, pinned, func(o *craftOpts) { o.fw = editedLog.Bytes() },
			latchkeyv1.Reason_EVENT_LOG_MISMATCH, fmt.Sprintf("pcr 4: firmware event log replays to %s, the quote holds %s", hx(editedLog.PCRs[4]), hx(good.pcrs[4]))},
		{"log truncated at an event", good, pinned, func(o *craftOpts) { o.fw = cut },
			latchkeyv1.Reason_EVENT_LOG_MISMATCH, fmt.Sprintf("pcr 5: firmware event log replays to %s, the quote holds %s", hx(sha256.Sum256(append(make([]byte, 32), sepDigest()...))), hx(good.pcrs[5]))},
		{"log truncated inside an event", good, pinned, func(o *craftOpts) { o.fw = truncated[:len(truncated)-7] },
			latchkeyv1.Reason_MALFORMED, "firmware event log: "},
		{"log with an extra event", good, pinned, func(o *craftOpts) { o.fw = extra.Bytes() },
			latchkeyv1.Reason_EVENT_LOG_MISMATCH, fmt.Sprintf("pcr 4: firmware event log replays to %s, the quote holds %s", hx(extra.PCRs[4]), hx(good.pcrs[4]))},
		{"log extends an unquoted pcr", good, pinned, func(o *craftOpts) { o.fw = unquoted.Bytes() },
			latchkeyv1.Reason_EVENT_LOG_MISMATCH, "event log extends pcr 16, which the quote does not cover"},
		{"no log", good, pinned, func(o *craftOpts) { o.fw = nil },
			latchkeyv1.Reason_EVENT_LOG_MISMATCH, "the policy checks boot components, the evidence carries no firmware event log"},
		{"section measured twice", boot(t, dup, sysinit), pinned, nil,
			latchkeyv1.Reason_EVENT_LOG_MISMATCH, "pcr 11: section .cmdline measured twice (measurement 9)"},
		{"uki not in the policy", otherUKI, pinned, nil,
			latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "uki " + dgst(edited.UKI) + " in pcr 4 is not allowed"},
		{"boot loader not in the policy", boot(t, noLoader, sysinit), pinned, nil,
			latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "boot loader " + dgst(noLoader.Loaders[0]) + " in pcr 4 is not allowed"},
		{"secure boot off", boot(t, sbOff, sysinit), pinned, nil,
			latchkeyv1.Reason_SECURE_BOOT_REQUIRED, "secure boot is off (pcr 7), the policy requires it"},
		{"db certificate not listed", good, &tpm.BootPolicy{UKIs: pinned.UKIs, BootLoaders: pinned.BootLoaders,
			SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{otherPEM}}}, nil,
			latchkeyv1.Reason_SECURE_BOOT_REQUIRED, `secure boot db certificate "CN=test db" (` + dgst(sha256.Sum256(der)) + ") in pcr 7 is not allowed"},
		{"command line passed", boot(t, passed, sysinit), pinned, nil,
			latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, `kernel command line "console=ttyS0 init=/bin/sh" in pcr 12 is not allowed`},
		{"built-in command line not listed", good, &tpm.BootPolicy{UKIs: pinned.UKIs, BootLoaders: pinned.BootLoaders,
			KernelCmdlines: []string{"console=ttyS0"}, SecureBoot: pinned.SecureBoot}, nil,
			latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "uki .cmdline " + dgst(sha256.Sum256([]byte("console=ttyS0 ro"))) + " in pcr 11 is not an allowed kernel command line"},
		{"pcr 11 signed by an untrusted key", byStranger, signed, nil,
			latchkeyv1.Reason_PCR_SIGNATURE_INVALID, fmt.Sprintf("pcr 11 value %s (phase %q) is signed only by keys [%s], none a valid signature of a pcr11Signer", hx(byStranger.pcrs[11]), sysinit, dgst(stranger.fp))},
		{"valid signature over another pcr 11 value", otherValue, signed, nil,
			latchkeyv1.Reason_PCR_SIGNATURE_INVALID, fmt.Sprintf("pcr 11 value %s (phase %q) is not signed: no signature entry has its policy digest %s", hx(otherValue.pcrs[11]), sysinit, hx(tpm.PolicyPCRDigest(otherValue.pcrs[11])))},
		{"signature for the wrong boot phase", initrd, signed, nil,
			latchkeyv1.Reason_PCR_SIGNATURE_INVALID, fmt.Sprintf(`uki %s: pcr 11 is in boot phase "enter-initrd", the policy accepts ["enter-initrd:leave-initrd:sysinit" "enter-initrd:leave-initrd:sysinit:ready" "sysinit" "sysinit:ready"]`, dgst(ukiDigest))},
		{"no pcr signature", unsigned, signed, nil,
			latchkeyv1.Reason_PCR_SIGNATURE_INVALID, "uki " + dgst(ukiDigest) + " is not in ukis and the evidence carries no pcr 11 signature"},
		{"signature tampered", signedOK, signed, func(o *craftOpts) {
			o.sig = []byte(strings.Replace(string(o.sig), `"sig":"`, `"sig":"AAAA`, 1))
		}, latchkeyv1.Reason_PCR_SIGNATURE_INVALID, fmt.Sprintf("pcr 11 value %s (phase %q) is signed only by keys [%s]", hx(signedOK.pcrs[11]), sysinit, dgst(sg.fp))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.m.validate(t, c.bp, c.edit)
			wantRefusal(t, err, c.reason, c.detail)
		})
	}
	// And the signed machine is admitted with no uki listed.
	if _, err := signedOK.validate(t, signed, nil); err != nil {
		t.Fatalf("signed uki refused: %v", err)
	}
}

// sepDigest is the digest of an EV_SEPARATOR (four zero bytes).
func sepDigest() []byte { d := sha256.Sum256([]byte{0, 0, 0, 0}); return d[:] }

// The PCR 11 values, policy digests and signatures of Debian 12's
// systemd-measure (testdata/systemd-measure) are what latchkey computes
// and accepts: stub replay plus phase words equals `calculate`, and
// PolicyPCRDigest of each value is the "pol" `sign` signed, verified
// with the key through the whole validator.
func TestSignatureFormatMatchesSystemdMeasure(t *testing.T) {
	dir := "testdata/systemd-measure"
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var calc struct {
		SHA256 []struct {
			Phase string `json:"phase"`
			Hash  string `json:"hash"`
		} `json:"sha256"`
	}
	if err := json.Unmarshal(read("calculate.json"), &calc); err != nil {
		t.Fatal(err)
	}
	var sig struct {
		SHA256 []struct {
			Pol string `json:"pol"`
		} `json:"sha256"`
	}
	if err := json.Unmarshal(read("sig.json"), &sig); err != nil {
		t.Fatal(err)
	}
	sections := []tpmtest.Section{{Name: ".linux", Data: read("linux")}, {Name: ".osrel", Data: read("osrel")},
		{Name: ".cmdline", Data: read("cmdline")}, {Name: ".initrd", Data: read("initrd")}}
	der, pemText := dbCert(t, "db")
	b := tpmtest.Boot{Firmware: "EDK II", SecureBoot: true, DB: [][]byte{der}, UKI: ukiDigest, Sections: sections}
	if len(calc.SHA256) != 4 || len(sig.SHA256) != 4 {
		t.Fatalf("calculate has %d, sign %d entries", len(calc.SHA256), len(sig.SHA256))
	}
	for i, c := range calc.SHA256 {
		m := boot(t, b, c.Phase)
		if got := hx(m.pcrs[11]); got != c.Hash {
			t.Fatalf("phase %s: pcr 11 %s, systemd-measure calculate %s", c.Phase, got, c.Hash)
		}
		if got := hx(tpm.PolicyPCRDigest(m.pcrs[11])); got != sig.SHA256[i].Pol {
			t.Fatalf("phase %s: policy digest %s, systemd-measure sign %s", c.Phase, got, sig.SHA256[i].Pol)
		}
		m.sig = read("sig.json")
		bp := &tpm.BootPolicy{PCR11Signers: []string{string(read("pub.pem"))}, PCR11Phases: []string{c.Phase},
			SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
		if _, err := m.validate(t, bp, nil); err != nil {
			t.Fatalf("phase %s: systemd-measure's signature refused: %v", c.Phase, err)
		}
	}
}

// Bad component policies fail at load time, naming the entry.
func TestBootPolicyCompileErrors(t *testing.T) {
	for name, c := range map[string]struct {
		bp   tpm.BootPolicy
		want string
	}{
		"uki digest":        {tpm.BootPolicy{UKIs: []string{"sha256:00"}}, `boot.ukis[0]: "sha256:00" is not sha256:<64 lower-case hex digits>`},
		"upper hex":         {tpm.BootPolicy{BootLoaders: []string{"sha256:" + strings.Repeat("A", 64)}}, "boot.bootLoaders[0]:"},
		"signer":            {tpm.BootPolicy{PCR11Signers: []string{"nope"}}, "boot.pcr11Signers[0]: not a pem PUBLIC KEY"},
		"db cert":           {tpm.BootPolicy{SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{"x"}}}, "boot.secureBoot.dbCertificates[0]: not a pem certificate"},
		"extra measurement": {tpm.BootPolicy{ExtraMeasurements: []string{"00"}}, `boot.extraMeasurements[0]: "00" is not sha256:<64 lower-case hex digits>`},
		"phase syntax":      {tpm.BootPolicy{PCR11Phases: []string{"enter-initrd:"}}, `boot.pcr11Phases[0]: "enter-initrd:" is not`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tpm.NewValidator(tpm.Policy{AKPublicKeyHashes: []string{newCrafted(t, true).akHash}, Boot: &c.bp})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

// A systemd log that does not decode, and a PCR signature JSON that does
// not, are MALFORMED with the cause.
func TestSystemdLogAndSignatureDecoding(t *testing.T) {
	der, _ := dbCert(t, "test db")
	m := boot(t, ukiBoot(t, der), sysinit)
	for name, c := range map[string]struct {
		edit func(*craftOpts)
		want string
	}{
		"no RS":  {func(o *craftOpts) { o.sd = []byte(`{"pcr":11}`) }, "systemd event log record 0 does not start with RS"},
		"no pcr": {func(o *craftOpts) { o.sd = []byte("\x1e{\"digests\":[]}\n") }, "systemd event log record 0: no pcr 0..23"},
		"no digest": {func(o *craftOpts) {
			o.sd = []byte("\x1e{\"pcr\":11,\"digests\":[{\"hashAlg\":\"sha1\",\"digest\":\"00\"}]}\n")
		}, "systemd event log record 0: no sha256 digest"},
		"torn record":    {func(o *craftOpts) { o.sd = []byte("\x1e{\"pcr\":11,\"dig") }, "systemd event log record 0: parse: "},
		"sd without fw":  {func(o *craftOpts) { o.fw, o.sd = nil, []byte("\x1e{}\n") }, "tpm evidence: systemd event log without a firmware event log"},
		"signature json": {func(o *craftOpts) { o.sig = []byte("{") }, "tpm evidence: pcr signature: "},
		"signature entry": {func(o *craftOpts) {
			o.sig = []byte(`{"sha256":[{"pcrs":[11],"pkfp":"zz","pol":"00","sig":"AA=="}]}`)
		}, "tpm evidence: pcr signature sha256 entry 0: pkfp, pol or sig malformed"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := m.validate(t, nil, c.edit)
			wantRefusal(t, err, latchkeyv1.Reason_MALFORMED, c.want)
		})
	}
}
