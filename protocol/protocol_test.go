package protocol

import (
	"regexp"
	"testing"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func TestRoleNamesRoundTrip(t *testing.T) {
	for _, r := range []latchkeyv1.Role{latchkeyv1.Role_ROLE_WORKER, latchkeyv1.Role_ROLE_CONTROL_PLANE} {
		got, ok := ParseRole(RoleName(r))
		if !ok || got != r {
			t.Fatalf("ParseRole(RoleName(%v)) = %v %v", r, got, ok)
		}
	}
	if n := RoleName(latchkeyv1.Role_ROLE_UNSPECIFIED); n != "" {
		t.Fatalf("unspecified role named %q", n)
	}
	for _, s := range []string{"", "Worker", "controlplane", "control-plane ", "master"} {
		if r, ok := ParseRole(s); ok || r != latchkeyv1.Role_ROLE_UNSPECIFIED {
			t.Fatalf("ParseRole(%q) = %v %v, want refused", s, r, ok)
		}
	}
}

func TestValidDiskUUID(t *testing.T) {
	for s, want := range map[string]bool{
		"3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b":   true,
		"3F2A9C1E-5B7D-4E8F-9A0B-1C2D3E4F5A6B":   false, // one disk, one form, one key
		"3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b":       false,
		"{3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b}": false,
		"3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b\n": false,
		"3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6":    false,
		"":                                       false,
	} {
		if got := ValidDiskUUID(s); got != want {
			t.Errorf("ValidDiskUUID(%q) = %v, want %v", s, got, want)
		}
	}
}

// diskUUIDRE is the expression ValidDiskUUID is written by hand from.
var diskUUIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ValidDiskUUID agrees with the expression on every input: the dash moved
// by one, a non-hex digit in each group, a capital, a trailing newline.
func FuzzValidDiskUUID(f *testing.F) {
	for _, s := range []string{"3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b", "3f2a9c1e5-b7d-4e8f-9a0b-1c2d3e4f5a6b",
		"3f2a9c1g-5b7d-4e8f-9a0b-1c2d3e4f5a6b", "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6B", "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b\n",
		"3f2a9c1e-5b7d-4e8f-9a0b:1c2d3e4f5a6b", "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidDiskUUID(s), diskUUIDRE.MatchString(s); got != want {
			t.Fatalf("ValidDiskUUID(%q) = %v, the expression says %v", s, got, want)
		}
	})
}
