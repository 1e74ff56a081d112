package config

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const pin2 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

// loadWith writes the file and the kernel command line (either may be
// empty: no file, an empty command line) and loads them with args.
func loadWith(t *testing.T, file, cmdline string, args ...string) (*Config, error) {
	t.Helper()
	dir := t.TempDir()
	cfgPath, clPath := filepath.Join(dir, "agent.yaml"), filepath.Join(dir, "cmdline")
	if file != "" {
		if err := os.WriteFile(cfgPath, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(clPath, []byte(cmdline), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var f Flags
	f.Register(fs)
	if err := fs.Parse(append([]string{"--config", cfgPath, "--kernel-cmdline", clPath}, args...)); err != nil {
		t.Fatal(err)
	}
	return f.Load()
}

// The precedence is file < kernel command line < flags, for every
// setting the kernel command line carries, and file < flags for the
// rest; a boolean flag only switches on.
func TestFlagsPrecedence(t *testing.T) {
	get := map[string]func(*Config) string{
		"verifiers": func(c *Config) string { return strings.Join(c.Verifiers, ",") },
		"pins":      func(c *Config) string { return strings.Join(c.VerifierPins, ",") },
		"wipe":      func(c *Config) string { return string(c.Disk.WipeStateDisk) },
		"node":      func(c *Config) string { return c.NodeName },
		"timeout":   func(c *Config) string { return c.Timeout.Duration.String() },
		"status":    func(c *Config) string { return c.StatusFile },
		"dryRun":    func(c *Config) string { return map[bool]string{true: "on", false: "off"}[c.Join.DryRun] },
	}
	for _, tc := range []struct {
		name, setting, file, cmdline string
		args                         []string
		want                         string
	}{
		{"verifier file", "verifiers", "verifiers: [file:1]\n", "", nil, "file:1"},
		{"verifier cmdline over file", "verifiers", "verifiers: [file:1]\n", "quiet latchkey.verifier=cl:1,cl:2 latchkey.verifier=cl:3", nil, "cl:1,cl:2,cl:3"},
		{"verifier flag over cmdline", "verifiers", "verifiers: [file:1]\n", "latchkey.verifier=cl:1", []string{"--verifier", "flag:1,flag:2"}, "flag:1,flag:2"},
		{"verifier flag over file", "verifiers", "verifiers: [file:1]\n", "", []string{"--verifier", "flag:1"}, "flag:1"},
		{"pin file", "pins", "verifierPins: [\"" + pin + "\"]\n", "", nil, pin},
		{"pin cmdline over file", "pins", "verifierPins: [\"" + pin + "\"]\n", "latchkey.pin=" + pin2, nil, pin2},
		{"pin flag over cmdline", "pins", "{}\n", "latchkey.pin=" + pin2, []string{"--pin", pin}, pin},
		{"wipe file", "wipe", "disk:\n  wipeStateDisk: from-file\n", "", nil, "from-file"},
		{"wipe cmdline over file", "wipe", "disk:\n  wipeStateDisk: from-file\n", "quiet latchkey.wipeStateDisk=from-cmdline", nil, "from-cmdline"},
		{"wipe flag over cmdline", "wipe", "disk:\n  wipeStateDisk: from-file\n", "latchkey.wipeStateDisk=from-cmdline",
			[]string{"--wipe-state-disk", "/dev/disk/by-id/virtio-state"}, "/dev/disk/by-id/virtio-state"},
		{"node file", "node", "nodeName: from-file\n", "", nil, "from-file"},
		{"node cmdline carries none", "node", "nodeName: from-file\n", "latchkey.nodeName=from-cmdline", nil, "from-file"},
		{"node flag over file", "node", "nodeName: from-file\n", "", []string{"--node-name", "from-flag"}, "from-flag"},
		{"timeout file", "timeout", "timeout: 90s\n", "", nil, "1m30s"},
		{"timeout flag over file", "timeout", "timeout: 90s\n", "", []string{"--timeout", "2m"}, "2m0s"},
		{"status file flag over file", "status", "statusFile: /run/from-file\n", "", []string{"--status-file", "-"}, "-"},
		{"dry run file stays on", "dryRun", "join:\n  dryRun: true\n", "", []string{"--dry-run=false"}, "on"},
		{"dry run flag switches on", "dryRun", "{}\n", "", []string{"--dry-run"}, "on"},
		{"dry run off", "dryRun", "{}\n", "", nil, "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadWith(t, tc.file, tc.cmdline, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got := get[tc.setting](c); got != tc.want {
				t.Fatalf("%s = %q, want %q", tc.setting, got, tc.want)
			}
		})
	}
}

// --config names a file that must exist; the default path may be absent
// (an image configured by the kernel command line alone). A boolean
// wipeStateDisk in the file is refused whatever overrides it.
func TestFlagsConfigFile(t *testing.T) {
	if _, err := loadWith(t, "", ""); err == nil || !strings.Contains(err.Error(), "agent.yaml") {
		t.Fatalf("an explicit --config that does not exist: %v", err)
	}
	var f Flags
	f.Register(flag.NewFlagSet("test", flag.ContinueOnError))
	if f.ConfigPath != DefaultPath || f.ConfigExplicit {
		t.Fatalf("default config %q explicit %v", f.ConfigPath, f.ConfigExplicit)
	}
	_, err := loadWith(t, "disk:\n  wipeStateDisk: true\n", "latchkey.wipeStateDisk=x")
	if err == nil || !strings.Contains(err.Error(), "it now names the disk it may destroy") {
		t.Fatalf("a boolean in the file: %v", err)
	}
	if c, err := loadWith(t, "verifierPins: [\""+pin+"\"]\n", "", "--timeout", "3s", "--role", "control-plane"); err != nil ||
		c.Timeout.Duration != 3*time.Second || c.Role != "control-plane" {
		t.Fatalf("config %+v, err %v", c, err)
	}
}

// A kernel command line that cannot be read is an error, since it may
// carry the verifier and its pin; only a missing /proc/cmdline (a
// container without /proc) adds nothing.
func TestKernelCmdlineReadErrors(t *testing.T) {
	dir := t.TempDir()
	load := func(args ...string) error {
		fset := flag.NewFlagSet("test", flag.ContinueOnError)
		var f Flags
		f.Register(fset)
		if err := fset.Parse(append([]string{"--config", writeFile(t, dir, "agent.yaml", "{}\n")}, args...)); err != nil {
			t.Fatal(err)
		}
		_, err := f.Load()
		return err
	}
	missing := filepath.Join(dir, "no-such-cmdline")
	err := load("--kernel-cmdline", missing)
	if err == nil || !strings.Contains(err.Error(), "--kernel-cmdline "+missing+": read kernel command line: ") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a named, missing command line: err = %v", err)
	}
	// A directory exists but cannot be read as a file.
	err = load("--kernel-cmdline", dir)
	if err == nil || !strings.Contains(err.Error(), "--kernel-cmdline "+dir+": read kernel command line: ") {
		t.Fatalf("an unreadable command line: err = %v", err)
	}
	if err := load("--kernel-cmdline", writeFile(t, dir, "cmdline", "quiet latchkey.verifier=a:1")); err != nil {
		t.Fatalf("a readable command line: %v", err)
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
