package predict_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/verifier/predict"
	"github.com/latchkey/latchkey/verifier/predict/predicttest"
)

// systemd-measure calculate over the section files gives, for each default
// phase, the PCR 11 predict computes from the assembled UKI.
func TestPCR11MatchesSystemdMeasure(t *testing.T) {
	u := predicttest.BuildUKI(t, t.TempDir())
	img, err := os.ReadFile(u.Path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := predict.ReadUKI(img, predict.Stub252)
	if err != nil {
		t.Fatalf("ReadUKI: %v", err)
	}
	out, err := exec.Command(predicttest.SystemdMeasure, "calculate", "--bank=sha256", "--json=short",
		"--linux="+u.Files[".linux"], "--osrel="+u.Files[".osrel"], "--cmdline="+u.Files[".cmdline"], "--initrd="+u.Files[".initrd"]).Output()
	if err != nil {
		t.Fatalf("systemd-measure calculate: %v", err)
	}
	var calc struct {
		SHA256 []struct{ Phase, Hash string } `json:"sha256"`
	}
	if err := json.Unmarshal(out, &calc); err != nil || len(calc.SHA256) != 4 {
		t.Fatalf("calculate output %s: %v", out, err)
	}
	for _, c := range calc.SHA256 {
		v := got.PCR11(c.Phase)
		if hex.EncodeToString(v[:]) != c.Hash {
			t.Errorf("phase %s: predicted %x, systemd-measure %s", c.Phase, v, c.Hash)
		}
	}
	if got.Cmdline() != predicttest.Cmdline {
		t.Errorf("cmdline %q, want %q", got.Cmdline(), predicttest.Cmdline)
	}
}

// osslsigncode's Authenticode digest of the signed UKI is ours.
func TestAuthenticodeMatchesOsslsigncode(t *testing.T) {
	signed, want := osslsigncodeDigest(t, "sha256")
	d, err := predict.Authenticode(signed)
	if err != nil {
		t.Fatalf("Authenticode: %v", err)
	}
	if len(want) != 64 || hex.EncodeToString(d[:]) != want {
		t.Fatalf("authenticode %x, osslsigncode %s", d, want)
	}
}

// osslsigncodeDigest signs a test UKI with osslsigncode using hash
// (sha256, sha384) and returns the signed image and the Authenticode
// digest osslsigncode calculates for it (lower-case hex).
func osslsigncodeDigest(t *testing.T, hash string) ([]byte, string) {
	t.Helper()
	dir := t.TempDir()
	u := predicttest.BuildUKI(t, dir)
	cert, key := selfSigned(t, dir)
	signed := filepath.Join(dir, "signed.efi")
	if out, err := exec.Command("osslsigncode", "sign", "-certs", cert, "-key", key, "-h", hash, "-in", u.Path, "-out", signed).CombinedOutput(); err != nil {
		t.Fatalf("osslsigncode sign: %v: %s", err, out)
	}
	out, _ := exec.Command("osslsigncode", "verify", "-in", signed).CombinedOutput() // fails on the untrusted cert, prints digests
	m := regexp.MustCompile(`Calculated message digest\s*:\s*([0-9A-Fa-f]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no calculated digest in osslsigncode output:\n%s", out)
	}
	img, err := os.ReadFile(signed)
	if err != nil {
		t.Fatal(err)
	}
	return img, strings.ToLower(string(m[1]))
}

func selfSigned(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	return pkitest.SelfSigned(t, "uki signer").WriteFiles(t, dir, "cert.pem", "key.pem")
}

// The snippet lists what a passed command line requires and parses back.
func TestPredictSnippet(t *testing.T) {
	u := predicttest.BuildUKI(t, t.TempDir())
	s, uki, err := predict.Predict(predict.Options{UKI: u.Path, Cmdlines: []string{"quiet"}, BootLoaders: []string{predicttest.Stub}})
	if err != nil {
		t.Fatalf("Predict: %v", err)
	}
	b := s.TPM.Boot
	if len(b.UKIs) != 1 || len(b.BootLoaders) != 1 || strings.Join(b.KernelCmdlines, "|") != predicttest.Cmdline+"|quiet" || len(s.TPM.PCRs[11]) != 4 {
		t.Fatalf("snippet = %+v", b)
	}
	var buf bytes.Buffer
	if err := predict.Write(&buf, s, uki); err != nil || !strings.Contains(buf.String(), "ukis:\n    - "+b.UKIs[0]) {
		t.Fatalf("Write: %v\n%s", err, buf.String())
	}
}

func TestReadUKIRefusesNonUKI(t *testing.T) {
	img, err := os.ReadFile(predicttest.Stub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := predict.ReadUKI(img, predict.Stub252); err == nil || !strings.Contains(err.Error(), "no .linux section") {
		t.Fatalf("err = %v", err)
	}
	if _, err := predict.Authenticode([]byte("MZ not really")); err == nil {
		t.Fatal("short image accepted")
	}
}

// The measured QEMU guest (attest/tpm/testdata/ovmf-uki): the UKI
// it booted predicts the Authenticode digest its firmware logged in PCR 4
// and the PCR 11 it quoted in phase "sysinit". The 15 MiB UKI is not in
// the repository: set LATCHKEY_MEASURED_UKI to it (scripts/e2e-vm.sh
// --phase2 with LATCHKEY_E2E_ARTIFACTS writes one).
func TestPredictionEqualsTheMeasuredGuest(t *testing.T) {
	path := os.Getenv("LATCHKEY_MEASURED_UKI")
	if path == "" {
		t.Skip("LATCHKEY_MEASURED_UKI not set")
	}
	s, _, err := predict.Predict(predict.Options{UKI: path, Phases: []string{"sysinit"}, SecureBootOff: true})
	if err != nil {
		t.Fatal(err)
	}
	const (
		quotedUKI   = "sha256:16fe1ad2d660969dea39905bd9eaf65cc3ecd37e5bd23e3bc8edaedc7d4dbc68"
		quotedPCR11 = "4bc7542d84f09f12b8d3e79b145452eac99fc1137b55d79e5c21866d0bf496a9"
	)
	if s.TPM.Boot.UKIs[0] != quotedUKI || s.TPM.PCRs[11][0] != quotedPCR11 {
		t.Fatalf("predicted uki %s pcr 11 %s; the guest logged %s and quoted %s", s.TPM.Boot.UKIs[0], s.TPM.PCRs[11][0], quotedUKI, quotedPCR11)
	}
}
