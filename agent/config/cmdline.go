package config

import (
	"fmt"
	"os"
	"strings"
)

// DefaultCmdlinePath is the kernel command line the agent reads
// latchkey.* settings from.
const DefaultCmdlinePath = "/proc/cmdline"

// maxCmdline bounds what is read from /proc/cmdline.
const maxCmdline = 64 << 10

// ApplyKernelCmdline overlays latchkey.verifier= and latchkey.pin= (each a
// comma-separated list; repeated keys add up) and latchkey.wipeStateDisk=
// (one disk's serial, by-id name or LUKS UUID; the last one wins) from a
// kernel command line. The command line is where a one-boot wipe belongs:
// it is gone at the next boot, unlike a setting baked into the image.
func (c *Config) ApplyKernelCmdline(cmdline string) {
	var verifiers, pins []string
	var wipe string
	for _, f := range strings.Fields(cmdline) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		switch k {
		case "latchkey.verifier":
			verifiers = append(verifiers, splitList(v)...)
		case "latchkey.pin":
			pins = append(pins, splitList(v)...)
		case "latchkey.wipeStateDisk":
			wipe = v
		}
	}
	if wipe != "" {
		c.Disk.WipeStateDisk = WipeTarget(wipe)
	}
	if len(verifiers) > 0 {
		c.Verifiers = verifiers
	}
	if len(pins) > 0 {
		c.VerifierPins = pins
	}
}

// ReadKernelCmdline reads /proc/cmdline (or path, for tests).
func ReadKernelCmdline(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read kernel command line: %w", err)
	}
	if len(b) > maxCmdline {
		b = b[:maxCmdline]
	}
	return string(b), nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
