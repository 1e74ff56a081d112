package tdx

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// dbCert is a self-signed certificate standing in for the Secure Boot db.
func dbCert(t *testing.T, cn string) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: verifyTime.AddDate(-1, 0, 0), NotAfter: verifyTime.AddDate(1, 0, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pemCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// ukiFixture is a synthesized TDVF boot of a UKI and the policy that
// admits it.
type ukiFixture struct {
	boot     tdxtest.UKIBoot
	loader   [48]byte
	cmdline  string
	db       []byte
	otherDB  []byte
	policy   func(*Policy)
	unlisted [48]byte
}

func newUKIFixture(t *testing.T) *ukiFixture {
	f := &ukiFixture{
		loader:   sha512.Sum384([]byte("systemd-boot")),
		unlisted: sha512.Sum384([]byte("another uki")),
		cmdline:  "console=hvc0 root=/dev/vda2",
		db:       dbCert(t, "latchkey test db"),
		otherDB:  dbCert(t, "someone else's db"),
	}
	f.boot = tdxtest.UKIBoot{
		SecureBoot: true, DB: [][]byte{f.db},
		Loaders: [][48]byte{f.loader},
		UKI:     sha512.Sum384([]byte("the uki")),
		Sections: []tdxtest.Section{
			{Name: ".linux", Data: []byte("kernel")},
			{Name: ".cmdline", Data: []byte(f.cmdline + "\n")},
			{Name: ".initrd", Data: []byte("initrd")},
		},
		GPT: append([]byte("EFI PART"), make([]byte, 84)...),
	}
	f.policy = func(p *Policy) {
		p.KernelCmdlines = []string{f.cmdline}
		p.Boot = &BootPolicy{
			UKIs:        []string{name384(f.boot.UKI)},
			BootLoaders: []string{name384(f.loader)},
			SecureBoot:  SecureBootPolicy{DBCertificates: []string{pemCert(f.db)}},
		}
	}
	return f
}

// run validates the log of attacker (the honest boot edited) in a quote
// whose RTMRs are those of honest, under the fixture's policy with edit.
func (f *ukiFixture) run(t *testing.T, honest, attacker tdxtest.UKIBoot, edit func(*Policy)) (*attest.Verified, error) {
	t.Helper()
	return f.runLogs(t, tdxtest.TDVFLog(honest), tdxtest.TDVFLog(attacker), edit)
}

// runLogs validates the log attacker in a quote whose RTMRs are those
// honest replays to, under the fixture's policy with edit.
func (f *ukiFixture) runLogs(t *testing.T, want, attacker *tdxtest.CCEL, edit func(*Policy)) (*attest.Verified, error) {
	t.Helper()
	x := newSigned(t, tdxtest.Collateral{}, func(p *Policy) {
		p.RTMRs = nil
		for _, r := range want.RTMRSlices() {
			p.RTMRs = append(p.RTMRs, []string{hex.EncodeToString(r)})
		}
		f.policy(p)
		if edit != nil {
			edit(p)
		}
	})
	body := x.s.Body()
	body.Rtmrs = want.RTMRSlices()
	return x.validateWithLog(t, body, tdxtest.CCELTable(), attacker.Bytes())
}

// editEvent is an Edit that rewrites the events match selects.
func editEvent(match func(rtmr int, data []byte, digest [48]byte) bool, to func(typ uint32, data []byte, digest [48]byte) (uint32, []byte, [48]byte)) func(int, uint32, []byte, [48]byte) (uint32, []byte, [48]byte) {
	return func(rtmr int, typ uint32, data []byte, digest [48]byte) (uint32, []byte, [48]byte) {
		if match(rtmr, data, digest) {
			return to(typ, data, digest)
		}
		return typ, data, digest
	}
}

func TestBootPolicyAccepted(t *testing.T) {
	f := newUKIFixture(t)
	ver, err := f.run(t, f.boot, f.boot, nil)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	b := ver.State.(*State).Boot
	if !b.SecureBootEnabled || len(b.DB) != 1 || len(b.Applications) != 2 || b.Applications[1].Digest != f.boot.UKI ||
		len(b.UKISections) != 3 || b.UKISections[0].Name != ".linux" || b.CmdlinePassed || len(b.Unexplained) != 0 {
		t.Fatalf("boot view %+v", b)
	}
}

func TestBootPolicyUKI(t *testing.T) {
	f := newUKIFixture(t)
	other := f.boot
	other.UKI = f.unlisted
	t.Run("not listed", func(t *testing.T) {
		_, err := f.run(t, other, other, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "uki "+name384(f.unlisted)+" in rtmr 1 is not allowed")
	})
	t.Run("log names the listed uki", func(t *testing.T) {
		// The quote measured the other UKI; the log claims the listed one.
		_, err := f.run(t, other, f.boot, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
	t.Run("relabelled as the partition table", func(t *testing.T) {
		// Digest kept, content rewritten to look like a GPT event: its
		// content does not hash to its digest, so it is still an
		// application.
		edited := other
		edited.Edit = editEvent(func(r int, _ []byte, d [48]byte) bool { return r == 1 && d == f.unlisted },
			func(_ uint32, _ []byte, d [48]byte) (uint32, []byte, [48]byte) {
				return tdxtest.EvEFIGPT, append([]byte("EFI PART"), make([]byte, 84)...), d
			})
		_, err := f.run(t, other, edited, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "uki "+name384(f.unlisted)+" in rtmr 1 is not allowed")
	})
	t.Run("relabelled as an EFI action", func(t *testing.T) {
		edited := other
		edited.Edit = editEvent(func(r int, _ []byte, d [48]byte) bool { return r == 1 && d == f.unlisted },
			func(_ uint32, _ []byte, d [48]byte) (uint32, []byte, [48]byte) {
				return tdxtest.EvEFIAction, []byte("Calling EFI Application from Boot Option"), d
			})
		_, err := f.run(t, other, edited, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "uki "+name384(f.unlisted)+" in rtmr 1 is not allowed")
	})
	t.Run("no uki", func(t *testing.T) {
		none := f.boot
		none.Sections = nil
		_, err := f.run(t, none, none, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "no uki in rtmr 1: rtmr 2 holds no systemd-stub section measurements")
	})
}

func TestBootPolicyLoader(t *testing.T) {
	f := newUKIFixture(t)
	evil := sha512.Sum384([]byte("unlisted loader"))
	other := f.boot
	other.Loaders = [][48]byte{evil}
	t.Run("not listed", func(t *testing.T) {
		_, err := f.run(t, other, other, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "boot loader "+name384(evil)+" in rtmr 1 is not allowed")
	})
	t.Run("log names the listed loader", func(t *testing.T) {
		_, err := f.run(t, other, f.boot, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
	t.Run("relabelled as a separator", func(t *testing.T) {
		edited := other
		edited.Edit = editEvent(func(r int, _ []byte, d [48]byte) bool { return r == 1 && d == evil },
			func(_ uint32, _ []byte, d [48]byte) (uint32, []byte, [48]byte) {
				return tdxtest.EvSeparator, []byte{0, 0, 0, 0}, d
			})
		_, err := f.run(t, other, edited, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "boot loader "+name384(evil)+" in rtmr 1 is not allowed")
	})
}

// isSecureBootVar matches the RTMR[0] SecureBoot variable event.
func isSecureBootVar(r int, data []byte, _ [48]byte) bool {
	return r == 0 && bytes.Contains(data, tdxtest.UTF16("SecureBoot")[:20])
}

func TestBootPolicySecureBoot(t *testing.T) {
	f := newUKIFixture(t)
	off := f.boot
	off.SecureBoot = false
	t.Run("off", func(t *testing.T) {
		_, err := f.run(t, off, off, nil)
		wantRefusal(t, err, latchkeyv1.Reason_SECURE_BOOT_REQUIRED, "secure boot is off (rtmr 0), the policy requires it")
	})
	t.Run("off allowed", func(t *testing.T) {
		if _, err := f.run(t, off, off, func(p *Policy) { p.Boot.SecureBoot.AllowDisabled = true }); err != nil {
			t.Fatalf("Validate: %v", err)
		}
	})
	t.Run("log says on", func(t *testing.T) {
		_, err := f.run(t, off, f.boot, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
	t.Run("variable edited, digest kept", func(t *testing.T) {
		edited := off
		edited.Edit = editEvent(isSecureBootVar, func(typ uint32, data []byte, d [48]byte) (uint32, []byte, [48]byte) {
			data = bytes.Clone(data)
			data[len(data)-1] = 1
			return typ, data, d
		})
		_, err := f.run(t, off, edited, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log: rtmr 0:")
	})
	t.Run("authority before the separator", func(t *testing.T) {
		// A firmware that measured an image verification before the
		// separator: both the quote and the log carry it.
		pre := f.boot
		pre.Edit = editEvent(func(r int, data []byte, _ [48]byte) bool {
			return r == 0 && bytes.Contains(data, tdxtest.UTF16("dbx")[:6]) && len(data) < 64
		}, func(_ uint32, data []byte, _ [48]byte) (uint32, []byte, [48]byte) {
			auth := append(append(bytes.Clone(data[:16]), 2, 0, 0, 0, 0, 0, 0, 0, byte(16+len(f.db)), byte((16+len(f.db))>>8), 0, 0, 0, 0, 0, 0, 'd', 0, 'b', 0), append(make([]byte, 16), f.db...)...)
			return tdxtest.EvEFIAuthority, auth, sha512.Sum384(auth)
		})
		_, err := f.run(t, pre, pre, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log: rtmr 0: 1 authorities before the separator")
	})
	other := f.boot
	other.DB = [][]byte{f.otherDB}
	t.Run("db not listed", func(t *testing.T) {
		_, err := f.run(t, other, other, nil)
		wantRefusal(t, err, latchkeyv1.Reason_SECURE_BOOT_REQUIRED, `secure boot db certificate "CN=someone else's db"`)
	})
	t.Run("log names the listed db", func(t *testing.T) {
		_, err := f.run(t, other, f.boot, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
}

func TestBootPolicyKernelMeasurements(t *testing.T) {
	f := newUKIFixture(t)
	passed := f.boot
	passed.Cmdline, passed.Passed = "console=hvc0 init=/bin/sh", true
	t.Run("passed command line, none listed", func(t *testing.T) {
		_, err := f.run(t, passed, passed, func(p *Policy) { p.KernelCmdlines = nil })
		wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, `kernel command line "console=hvc0 init=/bin/sh" passed to the uki (rtmr 2) is not allowed`)
	})
	t.Run("passed command line not listed", func(t *testing.T) {
		_, err := f.run(t, passed, passed, nil)
		wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, `measured kernel command line "console=hvc0 init=/bin/sh" is not in the policy`)
	})
	t.Run("passed command line listed", func(t *testing.T) {
		ver, err := f.run(t, passed, passed, func(p *Policy) { p.KernelCmdlines = append(p.KernelCmdlines, passed.Cmdline) })
		if err != nil {
			t.Fatalf("Validate: %v", err)
		}
		if st := ver.State.(*State); st.KernelCmdline != passed.Cmdline {
			t.Fatalf("cmdline %q", st.KernelCmdline)
		}
	})
	t.Run("passed command line rewritten, digest kept", func(t *testing.T) {
		// Slip-past: the log shows a listed line; its content no longer
		// hashes to the measured digest, so it is no command line but an
		// unexplained measurement.
		edited := passed
		edited.Edit = editEvent(func(r int, data []byte, _ [48]byte) bool {
			return r == 2 && bytes.Equal(data, tdxtest.UTF16(passed.Cmdline))
		}, func(typ uint32, _ []byte, d [48]byte) (uint32, []byte, [48]byte) {
			return typ, tdxtest.UTF16(f.cmdline), d
		})
		_, err := f.run(t, passed, edited, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 2: measurement 7 (sha384:")
	})
	t.Run("passed command line rewritten with its digest", func(t *testing.T) {
		listed := passed
		listed.Cmdline = f.cmdline
		_, err := f.run(t, passed, listed, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
	builtin := f.boot
	builtin.Sections = append([]tdxtest.Section(nil), f.boot.Sections...)
	builtin.Sections[1].Data = []byte("console=hvc0 init=/bin/sh")
	t.Run(".cmdline not listed", func(t *testing.T) {
		_, err := f.run(t, builtin, builtin, nil)
		d := sha512.Sum384(builtin.Sections[1].Data)
		wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "uki .cmdline "+name384(d)+" in rtmr 2 is not an allowed kernel command line")
	})
	t.Run(".cmdline claimed listed", func(t *testing.T) {
		_, err := f.run(t, builtin, f.boot, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
	t.Run("unexplained measurement", func(t *testing.T) {
		extra := sha512.Sum384([]byte("an initrd the kernel measured"))
		b := f.boot
		b.Extra = [][48]byte{extra}
		_, err := f.run(t, b, b, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 2: measurement 7 ("+name384(extra)+") is neither content-verified nor explained by the policy (boot.extraMeasurements)")
		if _, err := f.run(t, b, b, func(p *Policy) { p.Boot.ExtraMeasurements = []string{name384(extra)} }); err != nil {
			t.Fatalf("with extraMeasurements: %v", err)
		}
		// Slip-past: the log claims the measurement was a section name;
		// its content does not hash to the digest.
		edited := b
		edited.Edit = editEvent(func(r int, _ []byte, d [48]byte) bool { return r == 2 && d == extra },
			func(typ uint32, _ []byte, d [48]byte) (uint32, []byte, [48]byte) {
				return typ, tdxtest.UTF16(".ucode"), d
			})
		_, err = f.run(t, b, edited, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 2: measurement 7 ("+name384(extra)+")")
	})
	t.Run("section measured twice", func(t *testing.T) {
		dup := f.boot
		dup.Sections = append(append([]tdxtest.Section(nil), f.boot.Sections...), tdxtest.Section{Name: ".linux", Data: []byte("other kernel")})
		_, err := f.run(t, dup, dup, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 2: section .linux measured twice (measurement 7)")
	})
	t.Run("no log", func(t *testing.T) {
		x := newSigned(t, tdxtest.Collateral{}, f.policy)
		_, err := x.validateWithLog(t, x.s.Body(), nil, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "the policy checks boot components, the evidence carries no CC event log")
	})
}

// TestBootViewRealCCEL reads the component view of the recorded COS boot
// (shim, GRUB): two applications, no systemd-stub, GRUB's RTMR[2]
// measurements unexplained, so a boot policy refuses it unless it lists
// them.
func TestBootViewRealCCEL(t *testing.T) {
	q, table, log := cosEvidence(t)
	st := &State{}
	if err := replayCCEL(&wire.Evidence{CCELTable: table, CCEL: log}, q, st); err != nil {
		t.Fatal(err)
	}
	b := st.Boot
	if len(b.Applications) != 2 || len(b.UKISections) != 0 || b.CmdlinePassed || len(b.Unexplained) == 0 {
		t.Fatalf("boot view %+v", b)
	}
}
