package app_test

import (
	"bytes"
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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// A machine controls its event logs, not its PCRs. These joins run a
// real swtpm quote against the assembled verifier with log files the
// machine rewrote after measuring (the quote covers the PCRs, not the
// logs): the rewrites that used to release the disk key are refused with
// the exact reason, no ticket or token is released, and the audit line
// carries the detail.

var rewriteUKI = sha256.Sum256([]byte("rewrite uki"))

func rewriteSections() []tpmtest.Section {
	return []tpmtest.Section{{Name: ".linux", Data: []byte("kernel")}, {Name: ".osrel", Data: []byte("ID=debian\n")},
		{Name: ".cmdline", Data: []byte("console=ttyS0 ro")}, {Name: ".initrd", Data: []byte("initrd")}}
}

// logFiles writes a machine's log files and returns their paths.
func logFiles(t *testing.T, fw, sd, sig []byte) tpmissuer.LogPaths {
	t.Helper()
	dir := t.TempDir()
	p := tpmissuer.LogPaths{FirmwareEventLog: filepath.Join(dir, "binary_bios_measurements"), SystemdEventLog: tpmissuer.NoLog, PCRSignature: tpmissuer.NoLog}
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("binary_bios_measurements", fw)
	if sd != nil {
		p.SystemdEventLog = write("tpm2-measure.log", sd)
	}
	if sig != nil {
		p.PCRSignature = write("tpm2-pcr-signature.json", sig)
	}
	return p
}

func logIssuer(t *testing.T, sim *tpmtest.Simulator, paths tpmissuer.LogPaths) *tpmissuer.Issuer {
	t.Helper()
	iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device, PCRs: testPCRs, Logs: paths})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// refusedWithDetail is refusedWith that also checks the detail the agent
// got and that the audit line carries it.
func (r *rig) refusedWithDetail(t *testing.T, paths tpmissuer.LogPaths, want latchkeyv1.Reason, detail string) {
	t.Helper()
	iss := logIssuer(t, r.sim, paths)
	_, err := r.agentOnce(t, iss).Get(context.Background(), worker())
	var re *ticket.RefusedError
	if !errors.As(err, &re) || re.Reason != want || !strings.HasPrefix(re.Detail, detail) {
		t.Fatalf("err = %v, want %v: %s", err, want, detail)
	}
	if n := len(r.tokenSecrets(t)); n != 0 {
		t.Fatalf("%d token secrets after a refused join", n)
	}
	// The text handler quotes the error value.
	quoted := strings.Trim(strconv.Quote(detail), `"`)
	if !strings.Contains(r.logs.String(), "result=refused reason="+want.String()) || !strings.Contains(r.logs.String(), quoted) {
		t.Fatalf("audit log lacks the refusal %s:\n%s", detail, r.logs)
	}
}

// pcr11Signature signs PCR 11 in each phase of the standard chain from
// the stub's value, as `systemd-measure sign` does for a UKI, and returns
// the signature JSON and the signing key's PEM.
func pcr11Signature(t *testing.T, stub [32]byte) (sig []byte, pubPEM string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256(x509.MarshalPKCS1PublicKey(&k.PublicKey))
	type entry struct {
		PCRs []int  `json:"pcrs"`
		PKFP string `json:"pkfp"`
		Pol  string `json:"pol"`
		Sig  string `json:"sig"`
	}
	var entries []entry
	for i := range 4 {
		pol := tpm.PolicyPCRDigest(bootlog.ExtendPhase(stub, strings.Join(bootlog.StandardPhases[:i+1], ":")))
		h := sha256.Sum256(pol[:])
		s, err := rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, h[:])
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, entry{[]int{11}, hex.EncodeToString(fp[:]), hex.EncodeToString(pol[:]), base64.StdEncoding.EncodeToString(s)})
	}
	out, err := json.Marshal(map[string][]entry{"sha256": entries})
	if err != nil {
		t.Fatal(err)
	}
	return out, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// A machine stopped in the initrd (PCR 11 holds the UKI's sections and
// "enter-initrd" only), its UKI signed for every phase, rewrites the
// content of its systemd phase record to the phases the policy accepts.
func TestTPMJoinPhaseRewriteRefused(t *testing.T) {
	sim := tpmtest.StartFresh(t)
	l := tpmtest.OVMFLog(tpmtest.Boot{Firmware: "EDK II", UKI: rewriteUKI, Sections: rewriteSections()})
	l.Measure(t, sim)
	sim.Extend(t, 11, []byte("enter-initrd"))
	sd := tpmtest.SystemdLog(map[int][32]byte{}, tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "enter-initrd"})
	sig, signer := pcr11Signature(t, l.PCRs[11])
	pol := tpm.Policy{EKCARoots: sim.EKCARootsPEM, Boot: &tpm.BootPolicy{PCR11Signers: []string{signer},
		SecureBoot: tpm.SecureBootPolicy{AllowDisabled: true}}}
	_, cfg := verifierFiles(t, map[string]any{"tpm": pol}, randomSecret(), "test-cluster")
	r := startRig(t, sim, cfg)

	r.refusedWithDetail(t, logFiles(t, l.Bytes(), sd, sig), latchkeyv1.Reason_PCR_SIGNATURE_INVALID,
		fmt.Sprintf(`uki sha256:%x: pcr 11 is in boot phase "enter-initrd"`, rewriteUKI))

	edited := bytes.Replace(sd, []byte(`"string":"enter-initrd"`), []byte(`"string":"enter-initrd:leave-initrd:sysinit"`), 1)
	if bytes.Equal(edited, sd) {
		t.Fatal("the edit changed nothing")
	}
	want := fmt.Sprintf("pcr 11: measurement 9 (sha256:%x) is neither content-verified nor explained by the policy", sha256.Sum256([]byte("enter-initrd")))
	r.refusedWithDetail(t, logFiles(t, l.Bytes(), edited, sig), latchkeyv1.Reason_EVENT_LOG_MISMATCH, want)

	// Built to slip past: the rewritten record carried in the firmware
	// log instead (it replays the same), with no systemd log at all.
	moved := tpmtest.OVMFLog(tpmtest.Boot{Firmware: "EDK II", UKI: rewriteUKI, Sections: rewriteSections()})
	moved.Add(11, tpmtest.EvIPL, []byte("enter-initrd:leave-initrd:sysinit"), sha256.Sum256([]byte("enter-initrd")))
	r.refusedWithDetail(t, logFiles(t, moved.Bytes(), nil, sig), latchkeyv1.Reason_EVENT_LOG_MISMATCH, want)
}

// A boot loader passed init=/bin/sh to the UKI; the machine rewrites the
// data of its PCR 12 command-line event (same length, digest untouched).
func TestTPMJoinCmdlineRewriteRefused(t *testing.T) {
	const cmdline, innocent = "console=ttyS0 init=/bin/sh", "console=ttyS0 ro quiet=yes"
	sim := tpmtest.StartFresh(t)
	l := tpmtest.OVMFLog(tpmtest.Boot{Firmware: "EDK II", UKI: rewriteUKI, Sections: rewriteSections(), Cmdline: cmdline, Passed: true})
	l.Measure(t, sim)
	for _, w := range bootlog.StandardPhases[:3] {
		sim.Extend(t, 11, []byte(w))
	}
	pol := tpm.Policy{EKCARoots: sim.EKCARootsPEM, Boot: &tpm.BootPolicy{UKIs: []string{fmt.Sprintf("sha256:%x", rewriteUKI)},
		SecureBoot: tpm.SecureBootPolicy{AllowDisabled: true}}}
	_, cfg := verifierFiles(t, map[string]any{"tpm": pol}, randomSecret(), "test-cluster")
	r := startRig(t, sim, cfg)

	r.refusedWithDetail(t, logFiles(t, l.Bytes(), nil, nil), latchkeyv1.Reason_CMDLINE_NOT_ALLOWED,
		fmt.Sprintf("kernel command line %q in pcr 12 is not allowed", cmdline))

	edited := bytes.Replace(l.Bytes(), tpmtest.UTF16(cmdline), tpmtest.UTF16(innocent), 1)
	if bytes.Equal(edited, l.Bytes()) {
		t.Fatal("the edit changed nothing")
	}
	digest := sha256.Sum256(tpmtest.UTF16(cmdline))
	want := fmt.Sprintf("pcr 12: measurement 1 (sha256:%x) is neither content-verified nor explained by the policy", digest)
	r.refusedWithDetail(t, logFiles(t, edited, nil, nil), latchkeyv1.Reason_EVENT_LOG_MISMATCH, want)

	// Built to slip past: the command-line event taken out of the
	// firmware log and carried, rewritten, as a systemd record (PCR 12
	// replays the same: firmware events, then systemd's).
	without := tpmtest.OVMFLog(tpmtest.Boot{Firmware: "EDK II", UKI: rewriteUKI, Sections: rewriteSections()})
	sd := fmt.Appendf(nil, "\x1e{\"pcr\":12,\"digests\":[{\"hashAlg\":\"sha256\",\"digest\":\"%x\"}],\"content_type\":\"systemd\",\"content\":{\"string\":%q,\"eventType\":\"stub\"}}\n", digest, innocent)
	r.refusedWithDetail(t, logFiles(t, without.Bytes(), sd, nil), latchkeyv1.Reason_EVENT_LOG_MISMATCH, want)
}
