// Package predicttest assembles a small unified kernel image for tests, the
// way systemd-measure(1)'s example does: objcopy adds dummy section files
// to Debian's systemd-stub (package systemd-boot-efi). It imports testing
// and must only be imported from _test.go files.
package predicttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Tools the tests use (scripts/test.sh installs them).
const (
	Stub           = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	SystemdMeasure = "/usr/lib/systemd/systemd-measure"
	// Cmdline is the built UKI's .cmdline.
	Cmdline = "console=ttyS0 ro latchkey.test=1"
)

// UKI is an assembled image and the files its sections came from.
type UKI struct {
	Path string
	// Files maps a section name to the file it was built from.
	Files map[string]string
	// Data maps a section name to its contents.
	Data map[string][]byte
}

// BuildUKI writes the section files and the UKI into dir.
func BuildUKI(t testing.TB, dir string) *UKI {
	t.Helper()
	for _, tool := range []string{Stub, SystemdMeasure} {
		if _, err := os.Stat(tool); err != nil {
			t.Fatalf("%s missing (apt-get install systemd-boot-efi systemd): %v", tool, err)
		}
	}
	u := &UKI{Path: filepath.Join(dir, "uki.efi"), Files: map[string]string{}, Data: map[string][]byte{
		".linux":   pattern("kernel", 5000),
		".osrel":   []byte("ID=debian\nVERSION_ID=12\n"),
		".cmdline": []byte(Cmdline),
		".initrd":  pattern("initrd", 3000),
	}}
	args := []string{}
	vma := map[string]string{".osrel": "0x20000", ".cmdline": "0x30000", ".linux": "0x2000000", ".initrd": "0x3000000"}
	for _, name := range []string{".osrel", ".cmdline", ".linux", ".initrd"} {
		f := filepath.Join(dir, name[1:])
		if err := os.WriteFile(f, u.Data[name], 0o600); err != nil {
			t.Fatal(err)
		}
		u.Files[name] = f
		args = append(args, "--add-section", name+"="+f, "--change-section-vma", name+"="+vma[name])
	}
	args = append(args, Stub, u.Path)
	if out, err := exec.Command("objcopy", args...).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v: %s", err, out)
	}
	return u
}

func pattern(s string, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = s[i%len(s)] + byte(i/len(s))
	}
	return b
}
