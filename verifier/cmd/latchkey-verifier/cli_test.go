package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets a test run main as a real process, so exit codes and the
// log lines on stderr are the binary's.
func TestMain(m *testing.M) {
	if os.Getenv("LATCHKEY_VERIFIER_TEST_MAIN") == "1" {
		startTestProfile() // profile_test.go
		main()
	}
	os.Exit(m.Run())
}

func verifierProcess(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "LATCHKEY_VERIFIER_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

func TestVersionAndHelpExitZero(t *testing.T) {
	if code, out, _ := runCLI(t, "--version"); code != 0 || !strings.HasPrefix(out, "latchkey-verifier ") {
		t.Fatalf("--version: %d %q", code, out)
	}
	if code, out, _ := runCLI(t, "--help"); code != 0 || !strings.Contains(out, "recover-key") {
		t.Fatalf("--help: %d %q", code, out)
	}
	if code, out, _ := runCLI(t, "serve", "--help"); code != 0 || !strings.Contains(out, "-master-secret-file") {
		t.Fatalf("serve --help: %d %q", code, out)
	}
	// Every command's --help: TestEveryCommandHelp (help_test.go).
	if code, _, _ := runCLI(t); code != 2 {
		t.Fatalf("no command: %d, want 2", code)
	}
}

// A misconfigured verifier exits 2, which latchkey-verifier.service's
// RestartPreventExitStatus= covers, instead of a restart every 5 s.
func TestServeMisconfigurationExitsTwo(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "master")
	os.WriteFile(secret, bytes.Repeat([]byte{9}, 32), 0o600)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tiny"), 0o600)
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte("apiVersion: latchkey/v1\ntpm:\n  pcrs:\n    7: ["+strings.Repeat("ab", 32)+"]\n  ekCARoots: []\n"), 0o600)
	base := []string{"serve", "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state"), "--cluster-salt", "c"}
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing secret", []string{"--master-secret-file", filepath.Join(dir, "absent"), "--policy", policy}, "read master secret"},
		{"short secret", []string{"--master-secret-file", short, "--policy", policy}, "is 4 bytes, want at least 32"},
		{"missing policy", []string{"--master-secret-file", secret, "--policy", filepath.Join(dir, "absent.yaml")}, "absent.yaml"},
		{"bogus log level", []string{"--log-level", "bogus"}, `--log-level "bogus"`},
		{"join port in use", []string{"--master-secret-file", secret, "--policy", policy, "--listen", held.Addr().String()},
			"listen " + held.Addr().String()},
		{"state dir not writable", []string{"--master-secret-file", secret, "--policy", policy, "--state-dir", filepath.Join(secret, "state")},
			"stateDir " + filepath.Join(secret, "state")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, errs := verifierProcess(t, append(base, tc.args...)...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, errs, tc.want)
			}
		})
	}
}

// `policy check` is the gate before deployment: a policy that trusts no
// key, checks no measurement or pins a resettable PCR is refused, with
// every finding named.
func TestPolicyCheckRefusesUselessPolicies(t *testing.T) {
	dir := t.TempDir()
	digest := strings.Repeat("ab", 32)
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	bad := write("bad.yaml", "apiVersion: latchkey/v1\ntpm:\n  pcrs:\n    23: ["+digest+"]\n")
	code, _, errs := runCLI(t, "policy", "check", bad)
	if code != 1 || !strings.Contains(errs, "tpm: trusts no key") || !strings.Contains(errs, "pcrs.23 can be reset by software") ||
		!strings.Contains(errs, "not fit to deploy") {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	good := write("good.yaml", "apiVersion: latchkey/v1\ntpm:\n  ekPublicKeyHashes: [sha256:"+digest+"]\n  pcrs:\n    7: ["+digest+"]\n")
	if code, out, errs := runCLI(t, "policy", "check", good); code != 0 || !strings.Contains(out, "is valid") {
		t.Fatalf("good policy: code %d, out %q, err %q", code, out, errs)
	}
}
