package exitcode

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/cli"
)

// TestUnitMatchesCodes keeps the unit's restart policy honest: the codes
// that mean "a restart cannot help" are exactly the ones the unit prevents.
func TestUnitMatchesCodes(t *testing.T) {
	raw, err := os.ReadFile("../../units/latchkey-verifier.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RestartPreventExitStatus=(.*)$`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("latchkey-verifier.service has no RestartPreventExitStatus=")
	}
	if got, want := strings.Fields(string(m[1])), []string{strconv.Itoa(BadConfig)}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("RestartPreventExitStatus=%v, want %v", got, want)
	}
}

// internal/cli exits with its own codes for --help and flag errors; they
// must be the verifier's.
func TestCLICodesAgree(t *testing.T) {
	if cli.ExitOK != OK || cli.ExitUsage != BadConfig {
		t.Fatalf("cli.ExitOK %d cli.ExitUsage %d, want %d %d", cli.ExitOK, cli.ExitUsage, OK, BadConfig)
	}
}

// TestDocumented keeps docs/configuration.md's table of the verifier's
// exit codes complete.
func TestDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, doc, ok := strings.Cut(string(raw), "Exit codes of latchkey-verifier")
	if !ok {
		t.Fatal("docs/configuration.md has no table of the verifier's exit codes")
	}
	seen := map[string]int{}
	for code := OK; code <= Last; code++ {
		n := Name(code)
		if n == "unknown" {
			t.Fatalf("code %d has no name", code)
		}
		if prev, dup := seen[n]; dup {
			t.Fatalf("codes %d and %d share the name %q", prev, code, n)
		}
		seen[n] = code
		if !strings.Contains(doc, "| "+strconv.Itoa(code)+" | `"+n+"` |") {
			t.Errorf("docs/configuration.md does not list code %d as `%s`", code, n)
		}
	}
}
