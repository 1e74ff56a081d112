package exitcode

import (
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
	for code := OK; code <= Last; code++ {
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
