package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/verifier/exitcode"
)

// Every command's misuse exits exitcode.BadConfig (2) with a message
// saying how to use it, before touching a socket, a secret or the
// network.
func TestUsageErrorsExitBadConfig(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "no-admin.sock")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"serve unknown flag", []string{"serve", "--bogus"}, "flag provided but not defined: -bogus"},
		{"serve log level", []string{"serve", "--log-level", "loud"}, `--log-level "loud"`},
		{"pin unknown flag", []string{"pin", "--bogus"}, "flag provided but not defined: -bogus"},
		{"policy alone", []string{"policy"}, "usage: latchkey-verifier policy"},
		{"policy check no file", []string{"policy", "check"}, "usage: latchkey-verifier policy"},
		{"policy check two files", []string{"policy", "check", "a", "b"}, "usage: latchkey-verifier policy"},
		{"policy unknown", []string{"policy", "lint", "a"}, "usage: latchkey-verifier policy"},
		{"policy predict no uki", []string{"policy", "predict"}, "usage: latchkey-verifier policy"},
		{"tokens alone", []string{"tokens"}, "usage: latchkey-verifier tokens COMMAND"},
		{"tokens unknown flag", []string{"tokens", "list", "--bogus"}, "flag provided but not defined: -bogus"},
		{"tokens revoke no id", []string{"tokens", "revoke", "--socket", sock}, "usage: latchkey-verifier tokens revoke [flags] ID"},
		{"tokens list extra", []string{"tokens", "list", "--socket", sock, "x"}, "usage: latchkey-verifier tokens list [flags]"},
		{"tokens unknown", []string{"tokens", "drop", "--socket", sock}, `unknown command "tokens drop"`},
		{"bindings alone", []string{"bindings"}, "usage: latchkey-verifier bindings COMMAND"},
		{"bindings extra", []string{"bindings", "list", "x"}, "usage: latchkey-verifier bindings list [flags]"},
		{"bindings release nothing", []string{"bindings", "release"}, "(one of --node NAME or --disk UUID)"},
		{"bindings unknown", []string{"bindings", "drop"}, `unknown command "bindings drop"`},
		{"collateral alone", []string{"collateral"}, "usage: latchkey-verifier collateral"},
		{"collateral unknown", []string{"collateral", "get"}, "usage: latchkey-verifier collateral"},
		{"collateral bad chip", []string{"collateral", "fetch", "--chip-id", "ab", "--tcb", "1"}, "--chip-id must be 128 hex digits"},
		{"collateral bad fmspc", []string{"collateral", "fetch", "--tdx-fmspc", "50806f"}, "--tdx-fmspc must be 12 hex digits"},
		{"collateral bad ca", []string{"collateral", "fetch", "--tdx-fmspc", "50806f000000", "--tdx-ca", "root"}, "--tdx-ca must be platform or processor"},
		{"collateral tdx no dir", []string{"collateral", "fetch", "--tdx-fmspc", "50806f000000", "--config", filepath.Join(dir, "none.yaml")}, "no tdxCollateralDir configured"},
		{"secret alone", []string{"secret"}, "usage: latchkey-verifier secret"},
		{"secret init no file", []string{"secret", "init"}, "usage: latchkey-verifier secret"},
		{"secret unknown", []string{"secret", "rotate"}, "usage: latchkey-verifier secret"},
		{"secret id unknown flag", []string{"secret", "id", "--bogus"}, "flag provided but not defined: -bogus"},
		{"recover-key nothing", []string{"recover-key"}, "--disk-uuid UUID --out FILE|- (the UUID in canonical"},
		{"recover-key upper-case uuid", []string{"recover-key", "--disk-uuid", "0F8FAD5B-D9CB-469F-A165-70867728950E", "--out", "-"},
			"--disk-uuid UUID --out FILE|- (the UUID in canonical"},
		{"recover-key no out", []string{"recover-key", "--disk-uuid", "0f8fad5b-d9cb-469f-a165-70867728950e"},
			"--disk-uuid UUID --out FILE|- (the UUID in canonical"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := runCLI(t, tc.args...)
			if code != exitcode.BadConfig || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d (%s), stderr %q; want %d and %q", code, exitcode.Name(code), errs, exitcode.BadConfig, tc.want)
			}
		})
	}
}
