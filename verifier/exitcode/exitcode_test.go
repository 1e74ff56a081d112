package exitcode

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/internal/systemdunit"
)

// The unit must not restart the verifier on exactly the codes a restart
// cannot help: BadConfig alone.
func TestUnitMatchesCodes(t *testing.T) {
	got, err := systemdunit.Fields("../../units/latchkey-verifier.service", "RestartPreventExitStatus")
	if err != nil || !slices.Equal(got, []string{strconv.Itoa(BadConfig)}) {
		t.Fatalf("RestartPreventExitStatus=%v (%v), want [%d]", got, err, BadConfig)
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
	if Name(-1) != "unknown" || Name(Last+1) != "unknown" {
		t.Fatalf("codes outside 0..%d are named %q and %q", Last, Name(-1), Name(Last+1))
	}
	if len(names) != Last+1 || len(slices.Compact(slices.Sorted(slices.Values(names[:])))) != len(names) {
		t.Fatalf("names %q: want one distinct name for each code 0..%d", names, Last)
	}
	for code, n := range names {
		if n == "" || Name(code) != n {
			t.Fatalf("code %d is named %q", code, Name(code))
		}
		if !strings.Contains(doc, "| "+strconv.Itoa(code)+" | `"+n+"` |") {
			t.Errorf("docs/configuration.md does not list code %d as `%s`", code, n)
		}
	}
}

// TestDocsAgreeWithUnit: docs/configuration.md's table says "no" under
// "restarted" for exactly the codes the unit's RestartPreventExitStatus=
// names, and documents every code.
func TestDocsAgreeWithUnit(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	table, err := systemdunit.RestartColumn(doc, "Exit codes of latchkey-verifier")
	if err != nil {
		t.Fatal(err)
	}
	prevent, err := systemdunit.Fields("../../units/latchkey-verifier.service", "RestartPreventExitStatus")
	if err != nil {
		t.Fatal(err)
	}
	codes := []int{}
	for code := OK; code <= Last; code++ {
		codes = append(codes, code)
	}
	for _, e := range systemdunit.CheckRestarts(table, prevent, codes) {
		t.Error(e)
	}
}
