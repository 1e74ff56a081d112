package systemdunit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFields(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.service")
	os.WriteFile(p, []byte("[Service]\nRestartPreventExitStatus=1\nRestartPreventExitStatus=2 3\n# RestartSec=9\nRestartSec=5s\n"), 0o600)
	if got, err := Fields(p, "RestartPreventExitStatus"); err != nil || strings.Join(got, " ") != "2 3" {
		t.Fatalf("got %v, %v; want the last assignment [2 3]", got, err)
	}
	if _, err := Fields(p, "TimeoutStartSec"); err == nil || !strings.Contains(err.Error(), "sets no TimeoutStartSec=") {
		t.Fatalf("missing key: %v", err)
	}
}
