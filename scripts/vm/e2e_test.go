//go:build vm

// Package vm wraps scripts/e2e-vm.sh, the QEMU + swtpm proof-by-real-boot
// harness, as a Go test for those who drive everything with `go test`:
//
//	go test -tags vm -timeout 60m -v ./scripts/vm/
//
// The build tag keeps it out of `go test ./...`: it needs root, apt-get,
// and several minutes of emulated boots. LATCHKEY_E2E_VM_ARGS selects the
// phase (default "--all").
package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestE2EVM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the VM harness needs root (debootstrap, apt-get, mkfs.ext4 -d with device nodes)")
	}
	args := strings.Fields(os.Getenv("LATCHKEY_E2E_VM_ARGS"))
	if len(args) == 0 {
		args = []string{"--all"}
	}
	script, err := filepath.Abs(filepath.Join("..", "e2e-vm.sh"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(script, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v (serial consoles and logs under out/e2e-vm)", script, strings.Join(args, " "), err)
	}
}
