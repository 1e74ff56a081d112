package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/verifier/exitcode"

	"github.com/latchkey/latchkey/internal/cli/clitest"
)

// TestEveryCommandHelp: every command's --help (and help CMD) exits 0 and
// lists only the flags the command takes; in particular no command but
// serve lists serve's -listen, -policy or -log-format.
func TestEveryCommandHelp(t *testing.T) {
	clitest.CheckHelp(t, &program, func(args ...string) (int, string, string) { return runCLI(t, args...) },
		map[string][]string{
			"serve":            {"config", "listen", "policy", "state-dir", "master-secret-file", "cluster-salt", "log-level", "log-format"},
			"pin":              {"config", "state-dir"},
			"policy check":     nil,
			"policy diff":      {"config", "kubeconfig", "changed"},
			"policy predict":   {"uki", "boot-loader", "cmdline", "phase", "stub", "secure-boot-off", "variant", "reference-ccel", "reference-quote", "judge-rtmrs"},
			"tokens list":      {"socket"},
			"tokens revoke":    {"socket"},
			"bindings list":    {"socket"},
			"bindings release": {"socket", "node", "disk"},
			"bindings migrate": {"config", "from-dir"},
			"store check":      {"config"},
			"collateral fetch": {"config", "product", "chip-id", "tcb", "tdx-fmspc", "tdx-ca", "log-level", "log-format"},
			"secret init":      {"generation"},
			"secret id":        {"config", "master-secret-file", "cluster-salt"},
			"secret retire":    {"config", "socket", "generation"},
			"recover-key":      {"config", "master-secret-file", "cluster-salt", "disk-uuid", "generation", "out"},
			"version":          nil,
		})
}

// serve takes its log format and level from the config file's log
// section, the flags override it, and its keys are strict.
func TestServeLogSettingsFromConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// No policy configured: a bad configuration, logged at error.
	cfg := write("json.yaml", "clusterSalt: c\nlog:\n  level: warn\n  format: json\n")
	code, errs := verifierProcess(t, "serve", "--config", cfg)
	var m map[string]any
	if code != exitcode.BadConfig || json.Unmarshal([]byte(strings.TrimSpace(errs)), &m) != nil ||
		m["msg"] != "bad configuration" || m["level"] != "ERROR" || !strings.Contains(fmt.Sprint(m["error"]), "no policy file configured") {
		t.Fatalf("log.format json: exit %d, stderr %q; want one JSON error line", code, errs)
	}
	code, errs = verifierProcess(t, "serve", "--config", cfg, "--log-format", "text")
	if code != exitcode.BadConfig || !strings.Contains(errs, `level=ERROR msg="bad configuration"`) {
		t.Fatalf("--log-format text over the file: exit %d, stderr %q", code, errs)
	}
	for _, tc := range []struct{ body, want string }{
		{"log:\n  Level: debug\n", "Level"},
		{"log:\n  colour: true\n", "colour"},
		{"log:\n  format: xml\n", `log format "xml": want text or json`},
	} {
		code, errs := verifierProcess(t, "serve", "--config", write("bad.yaml", "clusterSalt: c\n"+tc.body))
		if code != exitcode.BadConfig || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.body, code, errs, exitcode.BadConfig, tc.want)
		}
	}
}

// Every latchkey-verifier command line in the quickstart parses with
// this table: the command and each flag exist.
func TestQuickstartCommandsParse(t *testing.T) {
	if n := clitest.CheckDocCommands(t, &program, "../../../docs/quickstart.md"); n < 4 {
		t.Fatalf("checked %d latchkey-verifier commands in the quickstart, want at least 4", n)
	}
	// Not vacuous: a flag the command does not take is caught.
	if err := program.Check([]string{"pin", "--listen", ":1"}); err == nil || !strings.Contains(err.Error(), "-listen") {
		t.Fatalf("pin --listen: %v", err)
	}
}
