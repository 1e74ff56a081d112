package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/internal/cli/clitest"
)

// TestEveryCommandHelp: every command's --help (and help CMD) exits 0 and
// lists only the flags the command takes; measure lists none of run's
// (not the data-destroying -wipe-state-disk).
func TestEveryCommandHelp(t *testing.T) {
	runFlags := []string{"config", "verifier", "pin", "insecure-skip-verifier-auth", "verifier-name", "node-name", "role",
		"variant", "tpm-device", "disk-mode", "disk-device", "disk-uuid", "wipe-state-disk", "dry-run", "kubeadm-dry-run",
		"kubeadm", "ignore-preflight-errors", "no-join", "no-reattest", "reattest-interval", "kernel-cmdline", "timeout",
		"status-file", "log-level", "log-format"}
	clitest.CheckHelp(t, &program, func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		return code, out.String(), errb.String()
	}, map[string][]string{
		"run":     runFlags,
		"measure": {"config", "variant", "tpm-device", "kernel-cmdline"},
		"status":  {"socket", "status-file", "json"},
		"version": nil,
	})
}

// The config file's log section sets the format and level; the flags
// override it; its keys are strict like every other.
func TestLogSettingsFromConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	jsonCfg := write("json.yaml", "statusFile: \"-\"\nlog:\n  level: debug\n  format: json\n")
	// No verifier configured: a bad configuration, logged at error.
	base := []string{"run", "--kernel-cmdline", "/dev/null", "--config"}
	code, out, _ := agentProcess(t, append(base, jsonCfg)...)
	var m map[string]any
	if code != exitcode.BadConfig || json.Unmarshal([]byte(strings.TrimSpace(out)), &m) != nil ||
		m["msg"] != "bad configuration" || m["level"] != "ERROR" {
		t.Fatalf("log.format json: exit %d, output %q; want one JSON error line", code, out)
	}
	code, out, _ = agentProcess(t, append(base, jsonCfg, "--log-format", "text")...)
	if code != exitcode.BadConfig || !strings.Contains(out, `level=ERROR msg="bad configuration"`) {
		t.Fatalf("--log-format text over the file: exit %d, output %q", code, out)
	}
	for _, tc := range []struct{ body, want string }{
		{"log:\n  Format: json\n", "Format"},
		{"log:\n  colour: true\n", "colour"},
		{"log:\n  format: xml\n", `log format "xml": want text or json`},
		{"log:\n  level: loud\n", `log level "loud": want debug, info, warn or error`},
	} {
		code, out, _ := agentProcess(t, append(base, write("bad.yaml", "statusFile: \"-\"\n"+tc.body))...)
		if code != exitcode.BadConfig || !strings.Contains(out, tc.want) {
			t.Errorf("%q: exit %d, output %q; want %d and %q", tc.body, code, out, exitcode.BadConfig, tc.want)
		}
	}
}

// Every latchkey-agent command line in the quickstart parses with this
// table: the command and each flag exist.
func TestQuickstartCommandsParse(t *testing.T) {
	if n := clitest.CheckDocCommands(t, &program, "../../../docs/quickstart.md"); n < 3 {
		t.Fatalf("checked %d latchkey-agent commands in the quickstart, want at least 3", n)
	}
	if err := program.Check([]string{"measure", "--wipe-state-disk", "x"}); err == nil || !strings.Contains(err.Error(), "-wipe-state-disk") {
		t.Fatalf("measure --wipe-state-disk: %v", err)
	}
}
