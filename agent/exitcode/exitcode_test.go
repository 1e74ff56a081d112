package exitcode

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/systemdunit"
)

// TestUnitMatchesCodes keeps the unit's restart policy honest: the codes
// that mean "a restart cannot help" are exactly the ones the unit prevents.
func TestUnitMatchesCodes(t *testing.T) {
	got, err := systemdunit.Fields("../../units/latchkey-agent.service", "RestartPreventExitStatus")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{strconv.Itoa(BadConfig), strconv.Itoa(RefusedByPolicy), strconv.Itoa(DiskRefused),
		strconv.Itoa(VerifierNotAuthenticated), strconv.Itoa(DiskOpenFailed)}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("RestartPreventExitStatus=%v, want %v", got, want)
	}
}

func TestNamesAreDistinct(t *testing.T) {
	seen := map[string]int{}
	for _, code := range Codes {
		n := Name(code)
		if n == "unknown" {
			t.Fatalf("code %d has no name", code)
		}
		if prev, dup := seen[n]; dup {
			t.Fatalf("codes %d and %d share the name %q", prev, code, n)
		}
		seen[n] = code
	}
	if Name(99) != "unknown" {
		t.Fatalf("Name(99) = %q, want unknown", Name(99))
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
	table, err := systemdunit.RestartColumn(doc, "Exit codes (see `agent/exitcode`)")
	if err != nil {
		t.Fatal(err)
	}
	prevent, err := systemdunit.Fields("../../units/latchkey-agent.service", "RestartPreventExitStatus")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range systemdunit.CheckRestarts(table, prevent, Codes) {
		t.Error(e)
	}
	for _, code := range Codes {
		if !strings.Contains(string(doc), "| "+strconv.Itoa(code)+" | `"+Name(code)+"` |") {
			t.Errorf("docs/configuration.md does not name code %d `%s`", code, Name(code))
		}
	}
}
