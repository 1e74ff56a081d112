package tpm_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// measuredSwtpm is a swtpm whose PCRs were extended exactly as a
// synthesized OVMF + UKI boot logs them (firmware, stub, systemd 252's
// unlogged phase words), with the log files where an issuer reads them.
type measuredSwtpm struct {
	sim    *tpmtest.Simulator
	log    *tpmtest.FirmwareLog
	paths  tpmissuer.LogPaths
	dbPEM  string
	signer *signer
	ekHash string
}

func newMeasuredSwtpm(t *testing.T) *measuredSwtpm {
	t.Helper()
	sim := tpmtest.StartFresh(t)
	ekPolicy := measure(t, sim)
	der, pemText := dbCert(t, "test db")
	l := tpmtest.OVMFLog(ukiBoot(t, der))
	l.Measure(t, sim)
	for _, w := range strings.Split(sysinit, ":") {
		sim.Extend(t, 11, []byte(w))
	}
	pcr11 := maps.Clone(l.PCRs)
	tpmtest.ExtendPhase(pcr11, sysinit)
	sg := newSigner(t)
	dir := t.TempDir()
	paths := tpmissuer.LogPaths{
		FirmwareEventLog: filepath.Join(dir, "binary_bios_measurements"),
		SystemdEventLog:  filepath.Join(dir, "tpm2-measure.log"), // absent, as on systemd 252
		PCRSignature:     filepath.Join(dir, "tpm2-pcr-signature.json"),
	}
	for path, data := range map[string][]byte{paths.FirmwareEventLog: l.Bytes(), paths.PCRSignature: sg.sign(t, pcr11[11])} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return &measuredSwtpm{sim: sim, log: l, paths: paths, dbPEM: pemText, signer: sg, ekHash: ekPolicy.EKPublicKeyHashes[0]}
}

func (m *measuredSwtpm) policy(ukis ...string) tpm.Policy {
	return tpm.Policy{EKPublicKeyHashes: []string{m.ekHash}, Boot: &tpm.BootPolicy{
		UKIs: ukis, BootLoaders: []string{dgst(loaderDigest)}, PCR11Signers: []string{m.signer.pem},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{m.dbPEM}},
	}}
}

func (m *measuredSwtpm) join(t *testing.T, p tpm.Policy) (*tpm.State, error) {
	t.Helper()
	iss, err := tpmissuer.New(tpmissuer.Config{Device: m.sim.Device, Logs: m.paths})
	if err != nil {
		t.Fatal(err)
	}
	binding := newBinding(t)
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		t.Fatalf("Attest: %v", err)
	}
	defer a.Close()
	ver, err := attest.Validate(context.Background(), newValidator(t, p), a.Evidence(), binding, a.Respond)
	if err != nil {
		return nil, err
	}
	return stateOf(t, ver), nil
}

// A real quote of a real TPM whose PCRs the boot extended: the issuer
// sends the log and the signature, quotes every PCR the log touches, and
// the validator admits the UKI by its signed PCR 11 with no ukis listed.
func TestSwtpmLogReplaysAndSignedUKIIsAdmitted(t *testing.T) {
	m := newMeasuredSwtpm(t)
	st, err := m.join(t, m.policy())
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if _, ok := st.PCRs[11]; !ok || st.Boot == nil || st.Boot.Phase != sysinit || len(st.Boot.Applications) != 2 {
		t.Fatalf("state = %+v, boot %+v", st, st.Boot)
	}
}

// A measurement the log does not show (something extended PCR 4 after
// boot) is refused by replay against the real quote, naming the PCR.
func TestSwtpmUnloggedMeasurementIsRefused(t *testing.T) {
	m := newMeasuredSwtpm(t)
	m.sim.Extend(t, 4, []byte("unlogged"))
	_, err := m.join(t, m.policy())
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, fmt.Sprintf("pcr 4: firmware event log replays to %s, the quote holds ", hx(m.log.PCRs[4])))
}

// `latchkey-agent measure`'s component view of a machine, pasted as the
// component policy, admits that machine's join.
func TestMeasureBootPolicyAdmitsTheMachine(t *testing.T) {
	m := newMeasuredSwtpm(t)
	b, bp, err := tpmissuer.MeasureBoot(context.Background(), m.sim.Device, m.paths)
	if err != nil || b == nil {
		t.Fatalf("MeasureBoot: %v %v", b, err)
	}
	if len(bp.UKIs) != 1 || bp.UKIs[0] != dgst(ukiDigest) || len(bp.SecureBoot.DBCertificates) != 1 || bp.PCR11Phases[0] != sysinit {
		t.Fatalf("component policy = %+v", bp)
	}
	if _, err := m.join(t, tpm.Policy{EKPublicKeyHashes: []string{m.ekHash}, Boot: bp}); err != nil {
		t.Fatalf("measured policy refused the machine: %v", err)
	}
}
