package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/predict"
	"github.com/latchkey/latchkey/verifier/predict/predicttest"
)

// ukiMachine is a swtpm whose PCRs were extended as OVMF and systemd-stub
// would boot the UKI: the sections come from the files the UKI was built
// from (not from predict's reading of the UKI), PCR 4's digest is the
// UKI's Authenticode digest (checked against osslsigncode in
// verifier/predict), the phase words as systemd 252 measures them.
type ukiMachine struct {
	sim   *tpmtest.Simulator
	paths tpmissuer.LogPaths
	log   *tpmtest.FirmwareLog
}

func bootUKI(t testing.TB, sim *tpmtest.Simulator, u *predicttest.UKI, ukiDigest [32]byte) *ukiMachine {
	t.Helper()
	var sections []tpmtest.Section
	for _, name := range []string{".linux", ".osrel", ".cmdline", ".initrd"} { // systemd-stub's order
		sections = append(sections, tpmtest.Section{Name: name, Data: u.Data[name]})
	}
	l := tpmtest.OVMFLog(tpmtest.Boot{Firmware: "EDK II", UKI: ukiDigest, Sections: sections})
	l.Measure(t, sim)
	for _, w := range strings.Split("enter-initrd:leave-initrd:sysinit", ":") {
		sim.Extend(t, 11, []byte(w))
	}
	dir := t.TempDir()
	m := &ukiMachine{sim: sim, log: l, paths: tpmissuer.LogPaths{
		FirmwareEventLog: filepath.Join(dir, "binary_bios_measurements"),
		SystemdEventLog:  tpmissuer.NoLog, PCRSignature: tpmissuer.NoLog,
	}}
	if err := os.WriteFile(m.paths.FirmwareEventLog, l.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *ukiMachine) issuer(t testing.TB) *tpmissuer.Issuer {
	t.Helper()
	iss, err := tpmissuer.New(tpmissuer.Config{Device: m.sim.Device, PCRs: testPCRs, Logs: m.paths})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// predictedRig starts the assembled verifier with the policy
// `latchkey-verifier policy predict --uki … --secure-boot-off` prints for
// u, plus the swtpm EK CA.
func predictedRig(t testing.TB, sim *tpmtest.Simulator, u *predicttest.UKI) *rig {
	t.Helper()
	snip, _, err := predict.Predict(predict.Options{UKI: u.Path, SecureBootOff: true})
	if err != nil {
		t.Fatal(err)
	}
	pol := *snip.TPM
	pol.EKCARoots = sim.EKCARootsPEM
	_, cfg := verifierFiles(t, map[string]any{"tpm": pol}, randomSecret(), "test-cluster")
	return startRig(t, sim, cfg)
}

// The predicted policy, pasted as it is, admits a machine booting the UKI
// through the whole verifier (attested TLS, activation, event-log
// replay, component policy, PCR 11 pin), with no golden boot.
func TestTPMJoinWithEventLogAndPredictedPolicy(t *testing.T) {
	u := predicttest.BuildUKI(t, t.TempDir())
	img, err := os.ReadFile(u.Path)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := predict.Authenticode(img)
	if err != nil {
		t.Fatal(err)
	}
	sim := tpmtest.StartFresh(t)
	m := bootUKI(t, sim, u, digest)
	r := predictedRig(t, sim, u)
	tk, err := r.agent(t, m.issuer(t), 30*time.Second).Get(context.Background(), worker())
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if len(tk.DiskKey) != 32 {
		t.Fatalf("disk key of %d bytes", len(tk.DiskKey))
	}
}

// Another UKI with the same sections (same PCR 11, another PCR 4 digest:
// a rebuilt stub) is refused by the component policy, naming it.
func TestTPMJoinWithUnlistedUKIRefused(t *testing.T) {
	u := predicttest.BuildUKI(t, t.TempDir())
	sim := tpmtest.StartFresh(t)
	other := [32]byte{0xee}
	m := bootUKI(t, sim, u, other)
	r := predictedRig(t, sim, u)
	r.refusedWith(t, m.issuer(t), worker(), latchkeyv1.Reason_COMPONENT_NOT_ALLOWED)
	if !strings.Contains(r.logs.String(), "uki sha256:ee00") {
		t.Fatalf("audit log does not name the uki:\n%s", r.logs)
	}
}
