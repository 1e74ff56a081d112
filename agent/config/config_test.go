package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const pin = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

func TestPrecedenceFileThenCmdline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(path, []byte("nodeName: n1\nverifiers: [file:1]\nverifierPins: [\""+pin+"\"]\ntimeout: 90s\n"), 0o600)
	c, err := LoadFile(path, true)
	if err != nil {
		t.Fatal(err)
	}
	c.ApplyKernelCmdline("ro quiet latchkey.verifier=a:1,b:2 latchkey.verifier=c:3 root=/dev/vda")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Verifiers, " ") != "a:1 b:2 c:3" || c.VerifierPins[0] != pin || c.Timeout.Duration != 90*time.Second {
		t.Fatalf("got %+v", c)
	}
	if c.Role != "worker" || c.Variant != "auto" || c.Disk.Mode != "luks" || c.Disk.WipeStateDisk != "" {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestUnknownFieldRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(path, []byte("verifier: [x]\n"), 0o600)
	if _, err := LoadFile(path, true); err == nil || !strings.Contains(err.Error(), `unknown field "verifier"`) {
		t.Fatalf("err = %v, want unknown field", err)
	}
}

func TestMissingDefaultFileIsEmpty(t *testing.T) {
	c, err := LoadFile(filepath.Join(t.TempDir(), "absent.yaml"), false)
	if err != nil || len(c.Verifiers) != 0 {
		t.Fatalf("%+v %v", c, err)
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "absent.yaml"), true); err == nil {
		t.Fatal("an explicit missing file must be an error")
	}
}

func TestNoPinRefused(t *testing.T) {
	c := &Config{Verifiers: []string{"v:1"}, NodeName: "n"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "no verifier pin") {
		t.Fatalf("err = %v", err)
	}
	c.InsecureSkipVerifierAuth = true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.VerifierPins = []string{"sha256:beef"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "64 hex") {
		t.Fatalf("bad pin: err = %v", err)
	}
}

func TestEnumsValidated(t *testing.T) {
	c := &Config{Verifiers: []string{"v:1"}, NodeName: "n", InsecureSkipVerifierAuth: true, Role: "master"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `role "master"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestCaseVariantAndDuplicateKeysRefused(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"case variant", "verifiers: [a:1]\nVerifiers: [b:1]\n", `unknown field "Verifiers"`},
		{"duplicate", "verifiers: [a:1]\nverifiers: [b:1]\n", `key "verifiers" already set in map`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agent.yaml")
			os.WriteFile(path, []byte(tc.yaml), 0o600)
			if _, err := LoadFile(path, true); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestWipeStateDiskNamesADisk: the key changed type from a boolean to the
// disk it may destroy; an old boolean is an error that says what to write.
func TestWipeStateDiskNamesADisk(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"disk:\n  wipeStateDisk: true\n", "disk.wipeStateDisk is true, but it now names the disk it may destroy"},
		{"disk:\n  wipeStateDisk: false\n", "disk.wipeStateDisk is false, but it now names the disk it may destroy"},
		{"disk:\n  wipeStateDisk: yes\n", "disk.wipeStateDisk is yes, but it now names the disk it may destroy"},
		{"disk:\n  wipeStateDisk: 12345\n", "must be a quoted string"},
	} {
		path := filepath.Join(t.TempDir(), "agent.yaml")
		os.WriteFile(path, []byte(c.yaml), 0o600)
		if _, err := LoadFile(path, true); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.yaml, err, c.want)
		}
	}
	path := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(path, []byte("disk:\n  wipeStateDisk: \"QM00002\"\n"), 0o600)
	c, err := LoadFile(path, true)
	if err != nil || c.Disk.WipeStateDisk != "QM00002" {
		t.Fatalf("quoted serial: %+v, %v", c.Disk, err)
	}
	// The kernel command line (one boot) overrides the file.
	c.ApplyKernelCmdline("quiet latchkey.wipeStateDisk=/dev/disk/by-id/virtio-state1 ro")
	if c.Disk.WipeStateDisk != "/dev/disk/by-id/virtio-state1" {
		t.Fatalf("cmdline: %q", c.Disk.WipeStateDisk)
	}
	c.ApplyKernelCmdline("quiet ro")
	if c.Disk.WipeStateDisk != "/dev/disk/by-id/virtio-state1" {
		t.Fatalf("a command line without the key cleared it: %q", c.Disk.WipeStateDisk)
	}
}

// TestBlankCheckOption: the zero value is the full check; "sampled" must
// be asked for exactly; anything else (a case variant, a typo, a
// boolean) is refused.
func TestBlankCheckOption(t *testing.T) {
	const base = "verifiers: [v1:7443]\nverifierPins: [\"sha256:" + "0000000000000000000000000000000000000000000000000000000000000000" + "\"]\n"
	load := func(t *testing.T, disk string) (*Config, error) {
		path := filepath.Join(t.TempDir(), "agent.yaml")
		os.WriteFile(path, []byte(base+disk), 0o600)
		c, err := LoadFile(path, true)
		if err != nil {
			return nil, err
		}
		return c, c.Validate()
	}
	for _, c := range []struct{ yaml, want string }{
		{"disk:\n  blankCheck: Full\n", `disk.blankCheck "Full": want full`},
		{"disk:\n  blankCheck: none\n", `disk.blankCheck "none": want full`},
		{"disk:\n  blankCheck: true\n", `key "disk.blankCheck": want a string, got bool`},
		{"disk:\n  blankcheck: sampled\n", `unknown field "disk.blankcheck"`},
		{"disk:\n  blankCheck: sampled\n  blankCheck: full\n", `key "disk.blankCheck" already set`},
	} {
		if _, err := load(t, c.yaml); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.yaml, err, c.want)
		}
	}
	for _, v := range []string{"", "full", "sampled"} {
		c, err := load(t, "disk:\n  blankCheck: \""+v+"\"\n")
		if err != nil {
			t.Errorf("blankCheck %q refused: %v", v, err)
		} else if c.Disk.BlankCheck != v {
			t.Errorf("blankCheck %q read as %q", v, c.Disk.BlankCheck)
		}
	}
}
