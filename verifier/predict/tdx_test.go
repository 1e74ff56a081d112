package predict_test

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx"
	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/verifier/predict"
	"github.com/latchkey/latchkey/verifier/predict/predicttest"
)

// tdxBoot is a synthesized TDVF boot of the assembled UKI (or, with
// old, of another one standing in for the reference boot), written by
// tdxtest's log builder: the measurements the firmware, systemd-stub
// and the kernel make, computed apart from predict's substitution.
func tdxBoot(t *testing.T, u *predict.UKI, img, db []byte, old bool) tdxtest.UKIBoot {
	t.Helper()
	b := tdxtest.UKIBoot{SecureBoot: true, DB: [][]byte{db}, GPT: append([]byte("EFI PART"), make([]byte, 84)...)}
	if old {
		b.UKI = sha512.Sum384([]byte("the reference uki"))
		b.Sections = []tdxtest.Section{{Name: ".linux", Data: []byte("old kernel")}, {Name: ".initrd", Data: []byte("old initrd")}}
		b.Extra = [][48]byte{sha512.Sum384([]byte("old initrd"))}
		return b
	}
	d, err := predict.Authenticode384(img)
	if err != nil {
		t.Fatal(err)
	}
	b.UKI = d
	for _, s := range u.Sections {
		b.Sections = append(b.Sections, tdxtest.Section{Name: s.Name, Data: s.Data})
		if s.Name == ".initrd" {
			b.Extra = [][48]byte{sha512.Sum384(s.Data)}
		}
	}
	return b
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// RTMR[1] and RTMR[2] predicted from a reference boot of another UKI
// are those of the log tdxtest writes for a boot of this one, and RTMR[0]
// is the reference's.
func TestPredictTDXRTMRs(t *testing.T) {
	dir := t.TempDir()
	pu := predicttest.BuildUKI(t, dir)
	img, err := os.ReadFile(pu.Path)
	if err != nil {
		t.Fatal(err)
	}
	u, err := predict.ReadUKI(img, predict.Stub252)
	if err != nil {
		t.Fatal(err)
	}
	db := pkitest.SelfSigned(t, "db").DER()
	ref := tdxtest.TDVFLog(tdxBoot(t, u, img, db, true))
	want := tdxtest.TDVFLog(tdxBoot(t, u, img, db, false))
	s, _, err := predict.PredictTDX(predict.TDXOptions{UKI: pu.Path, ReferenceCCEL: writeFile(t, dir, "ccel", ref.Bytes())})
	if err != nil {
		t.Fatalf("PredictTDX: %v", err)
	}
	if len(s.TDX.RTMRs) != 3 {
		t.Fatalf("rtmrs %v", s.TDX.RTMRs)
	}
	for i := range 3 {
		if got := s.TDX.RTMRs[i]; len(got) != 1 || got[0] != hex.EncodeToString(want.RTMRs[i][:]) {
			t.Errorf("RTMR[%d] predicted %v, the boot's log gives %x", i, got, want.RTMRs[i])
		}
	}
	if s.TDX.RTMRs[0][0] != hex.EncodeToString(ref.RTMRs[0][:]) {
		t.Errorf("RTMR[0] is not the reference's")
	}
	d, _ := predict.Authenticode384(img)
	if b := s.TDX.Boot; len(b.UKIs) != 1 || b.UKIs[0] != "sha384:"+hex.EncodeToString(d[:]) || len(s.TDX.MRTDs) != 0 {
		t.Fatalf("snippet %+v", s.TDX)
	}
	var buf bytes.Buffer
	if err := predict.WriteTDX(&buf, s, u); err != nil || !strings.Contains(buf.String(), "No MRTD (no --reference-quote)") {
		t.Fatalf("WriteTDX: %v\n%s", err, buf.String())
	}
}

// systemd-measure's SHA-384 PCR 11 of the section files (no phase) is
// the RTMR[2] predicted from a reference whose RTMR[2] holds only the
// stub's section pairs: the same fold, computed by systemd.
func TestPredictTDXStubMatchesSystemdMeasure(t *testing.T) {
	dir := t.TempDir()
	pu := predicttest.BuildUKI(t, dir)
	img, err := os.ReadFile(pu.Path)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := predict.ReadUKI(img, predict.Stub252)
	db := pkitest.SelfSigned(t, "db").DER()
	refBoot := tdxBoot(t, u, img, db, true)
	refBoot.Extra = nil
	rtmrs, err := predict.PredictRTMRs(tdxtest.TDVFLog(refBoot).Bytes(), [][48]byte{{}}, u, nil)
	if err != nil {
		t.Fatalf("PredictRTMRs: %v", err)
	}
	out, err := exec.Command(predicttest.SystemdMeasure, "calculate", "--bank=sha384", "--json=short", "--phase=",
		"--linux="+pu.Files[".linux"], "--osrel="+pu.Files[".osrel"], "--cmdline="+pu.Files[".cmdline"], "--initrd="+pu.Files[".initrd"]).Output()
	if err != nil {
		t.Fatalf("systemd-measure calculate: %v", err)
	}
	var calc struct {
		SHA384 []struct{ Hash string } `json:"sha384"`
	}
	if err := json.Unmarshal(out, &calc); err != nil || len(calc.SHA384) != 1 {
		t.Fatalf("calculate output %s: %v", out, err)
	}
	if rtmrs[2][0] != calc.SHA384[0].Hash {
		t.Fatalf("RTMR[2] predicted %s, systemd-measure %s", rtmrs[2][0], calc.SHA384[0].Hash)
	}
}

// osslsigncode's SHA-384 Authenticode digest of the signed UKI is ours.
func TestAuthenticode384MatchesOsslsigncode(t *testing.T) {
	signed, want := osslsigncodeDigest(t, "sha384")
	d, err := predict.Authenticode384(signed)
	if err != nil {
		t.Fatalf("Authenticode384: %v", err)
	}
	if len(want) != 96 || hex.EncodeToString(d[:]) != want {
		t.Fatalf("authenticode %x, osslsigncode %s", d, want)
	}
}

// The snippet predicted from a reference boot admits, in the validator,
// a TD that boots the UKI (its quote's RTMRs and its log).
func TestPredictTDXAdmitsTheBoot(t *testing.T) {
	t.Run("pinned", func(t *testing.T) { predictTDXAdmits(t, false) })
	// Judged: no RTMR[1] or RTMR[2] value; the initrd the kernel
	// measures is predicted into extraMeasurements.
	t.Run("judged", func(t *testing.T) { predictTDXAdmits(t, true) })
}

func predictTDXAdmits(t *testing.T, judge bool) {
	dir := t.TempDir()
	pu := predicttest.BuildUKI(t, dir)
	img, _ := os.ReadFile(pu.Path)
	u, _ := predict.ReadUKI(img, predict.Stub252)
	db := pkitest.SelfSigned(t, "db").DER()
	refBoot, boot := tdxBoot(t, u, img, db, true), tdxBoot(t, u, img, db, false)
	refBoot.SecureBoot, boot.SecureBoot = false, false
	s, _, err := predict.PredictTDX(predict.TDXOptions{UKI: pu.Path, SecureBootOff: true, ReferenceCCEL: writeFile(t, dir, "ccel", tdxtest.TDVFLog(refBoot).Bytes()), JudgeRTMRs: judge})
	if err != nil {
		t.Fatal(err)
	}
	extra := "sha384:" + hex.EncodeToString(boot.Extra[0][:])
	if judge {
		if len(s.TDX.RTMRs) != 1 || !slices.Equal(s.TDX.Boot.JudgedRTMRs, []int{1, 2}) || !slices.Equal(s.TDX.Boot.ExtraMeasurements, []string{extra}) {
			t.Fatalf("judged prediction: rtmrs %v, boot %+v", s.TDX.RTMRs, s.TDX.Boot)
		}
	}
	at := time.Now()
	signer := tdxtest.New(t, at)
	p := *s.TDX
	p.TrustedRoots = []string{signer.RootPEM()}
	p.MRTDs = []string{hex.EncodeToString(signer.Body().GetMrTd())}
	if !judge {
		p.Boot.ExtraMeasurements = []string{extra}
	}
	cdir := t.TempDir()
	if err := tdx.FetchCollateral(context.Background(), signer.Getter(tdxtest.Collateral{IssueDate: at.AddDate(0, 0, -1), NextUpdate: at.AddDate(0, 1, 0)}), p, tdxtest.FMSPC, "platform", cdir, at); err != nil {
		t.Fatal(err)
	}
	coll, err := tdx.NewCollateral(tdx.CollateralConfig{Dir: cdir})
	if err != nil {
		t.Fatal(err)
	}
	v, err := tdx.NewValidator(p, coll)
	if err != nil {
		t.Fatal(err)
	}
	log := tdxtest.TDVFLog(boot)
	body := signer.Body()
	body.Rtmrs = log.RTMRSlices()
	binding := bytes.Repeat([]byte{7}, attest.BindingSize)
	rd, _ := wire.ReportData(binding)
	ev, err := wire.EncodeEvidence(wire.Evidence{Quote: signer.Quote(body, rd), CCELTable: tdxtest.CCELTable(), CCEL: log.Bytes()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := attest.Validate(context.Background(), v, ev, binding, nil); err != nil {
		t.Fatalf("the predicted policy refuses the boot: %v", err)
	}
}

// cosEvidence is go-tdx-guest's recorded COS boot on real TDX hardware:
// its quote and CC event log.
func cosEvidence(t *testing.T) (quotePath, logPath string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/google/go-tdx-guest").Output()
	if err != nil {
		t.Fatalf("go list go-tdx-guest: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "testing", "testdata", "ccel")
	return filepath.Join(dir, "cos-113-tdx-quote.dat"), filepath.Join(dir, "ccel_data.dat")
}

// The fold predict uses, over a log recorded on real hardware, gives the
// RTMRs that hardware quoted; the MRTD a reference quote gives is its
// own; and a GRUB boot (no systemd-stub) predicts no UKI boot.
func TestPredictTDXRealReference(t *testing.T) {
	quotePath, logPath := cosEvidence(t)
	raw, _ := os.ReadFile(quotePath)
	q, err := abi.QuoteToProto(raw[:wire.QuoteLength(raw)])
	if err != nil {
		t.Fatal(err)
	}
	body := q.(*pb.QuoteV4).GetTdQuoteBody()
	logRaw, _ := os.ReadFile(logPath)
	got, err := predict.ReplayRTMRs(wire.TrimCCEL(logRaw))
	if err != nil {
		t.Fatalf("ReplayRTMRs: %v", err)
	}
	for i, r := range body.GetRtmrs() {
		if !bytes.Equal(got[i][:], r) {
			t.Errorf("RTMR[%d] folded %x, quoted %x", i, got[i], r)
		}
	}
	dir := t.TempDir()
	pu := predicttest.BuildUKI(t, dir)
	_, _, err = predict.PredictTDX(predict.TDXOptions{UKI: pu.Path, ReferenceCCEL: logPath, ReferenceQuote: quotePath})
	if err == nil || !strings.Contains(err.Error(), "the reference boot loaded 2 applications, the prediction boots 1 (boot loaders and the uki)") {
		t.Fatalf("PredictTDX over a GRUB boot: %v", err)
	}
	_, _, err = predict.PredictTDX(predict.TDXOptions{UKI: pu.Path, BootLoaders: []string{predicttest.Stub}, ReferenceCCEL: logPath, ReferenceQuote: quotePath})
	if err == nil || !strings.Contains(err.Error(), "the reference boot ran no systemd-stub (no section measurements in RTMR[2])") {
		t.Fatalf("PredictTDX over a GRUB boot: %v", err)
	}
}
