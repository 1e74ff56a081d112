package main

import (
	"bytes"
	"crypto/sha512"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/predict/predicttest"
)

// `policy predict` prints a snippet that, given a trust anchor, is a
// policy `policy check` and the verifier accept; bad use exits 2.
func TestPolicyPredictCLI(t *testing.T) {
	dir := t.TempDir()
	u := predicttest.BuildUKI(t, dir)
	var out, errOut bytes.Buffer
	if code := run([]string{"policy", "predict", "--uki", u.Path, "--phase", "sysinit", "--secure-boot-off"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	snippet := out.String()
	if !strings.Contains(snippet, "ukis:\n    - sha256:") || !strings.Contains(snippet, "pcr11Phases:\n    - sysinit") {
		t.Fatalf("snippet:\n%s", snippet)
	}
	pol := strings.Replace(snippet, "tpm:\n", "tpm:\n  akPublicKeyHashes: [\"sha256:"+strings.Repeat("a", 64)+"\"]\n", 1)
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.LoadFile(path, policy.Deps{}); err != nil {
		t.Fatalf("predicted policy does not load: %v\n%s", err, pol)
	}
	for _, args := range [][]string{{"policy", "predict"}, {"policy", "predict", "--uki", u.Path, "extra"}} {
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if code := run([]string{"policy", "predict", "--uki", filepath.Join(dir, "missing.efi")}, &out, &errOut); code != 1 {
		t.Errorf("missing uki: exit %d, want 1", code)
	}
}

// `policy predict --variant tdx` with a reference boot's CC event log
// prints a tdx snippet that, given a trust anchor, loads as a policy;
// tpm-only and tdx-only flags in the other variant exit 2.
func TestPolicyPredictTDXCLI(t *testing.T) {
	dir := t.TempDir()
	u := predicttest.BuildUKI(t, dir)
	ref := tdxtest.TDVFLog(tdxtest.UKIBoot{
		UKI:      sha512.Sum384([]byte("reference uki")),
		Sections: []tdxtest.Section{{Name: ".linux", Data: []byte("old kernel")}},
	})
	refPath := filepath.Join(dir, "ccel")
	if err := os.WriteFile(refPath, ref.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"policy", "predict", "--variant", "tdx", "--uki", u.Path, "--reference-ccel", refPath, "--secure-boot-off"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	snippet := out.String()
	if !strings.Contains(snippet, "ukis:\n    - sha384:") || !strings.Contains(snippet, "rtmrs:\n  - - ") || !strings.Contains(snippet, "No MRTD (no --reference-quote)") {
		t.Fatalf("snippet:\n%s", snippet)
	}
	pol := strings.Replace(snippet, "tdx:\n", "tdx:\n  mrtds: [\""+strings.Repeat("a", 96)+"\"]\n", 1)
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.LoadFile(path, policy.Deps{}); err != nil {
		t.Fatalf("predicted policy does not load: %v\n%s", err, pol)
	}
	// --judge-rtmrs: the judged form loads and passes policy check.
	out.Reset()
	if code := run([]string{"policy", "predict", "--variant", "tdx", "--uki", u.Path, "--reference-ccel", refPath, "--secure-boot-off", "--judge-rtmrs"}, &out, &errOut); code != 0 {
		t.Fatalf("--judge-rtmrs: exit %d: %s", code, errOut.String())
	}
	judged := out.String()
	if !strings.Contains(judged, "judgedRTMRs:\n    - 1\n    - 2\n") || strings.Count(judged, "  - - ") != 1 {
		t.Fatalf("judged snippet:\n%s", judged)
	}
	pol = strings.Replace(judged, "tdx:\n", "tdx:\n  mrtds: [\""+strings.Repeat("a", 96)+"\"]\n", 1)
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	var checkOut, checkErr bytes.Buffer
	if code := run([]string{"policy", "check", path}, &checkOut, &checkErr); code != 0 {
		t.Fatalf("policy check of the judged prediction: exit %d: %s\n%s", code, checkErr.String(), pol)
	}
	for _, args := range [][]string{
		{"policy", "predict", "--variant", "tdx", "--uki", u.Path, "--phase", "sysinit"},
		{"policy", "predict", "--uki", u.Path, "--reference-ccel", refPath},
		{"policy", "predict", "--uki", u.Path, "--judge-rtmrs"},
		{"policy", "predict", "--variant", "sev", "--uki", u.Path},
	} {
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
