package policy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/tpm"
)

// The deny list reads a verified state only through attest.State.Keys:
// the TPM's EK before its AK, the SNP chip; a state without keys is
// matched by its machine identity alone.
func TestDenyMatchesStateKeys(t *testing.T) {
	ek, ak, other := "sha256:"+digestA, "sha256:"+digestB, "sha256:"+strings.Repeat("cd", 32)
	chip := bytes.Repeat([]byte{0xab}, 64)
	load := func(deny string) *DenyList {
		t.Helper()
		s, err := Load([]byte("apiVersion: latchkey/v1\ntpm: {}\ndeny:\n"+deny), Deps{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Deny
	}
	both := &tpm.State{EKPublicKeyHash: ek, AKPublicKeyHash: ak}
	for _, tc := range []struct {
		name  string
		deny  string
		state attest.State
		id    string
		want  string
	}{
		{"ek", "  ekPublicKeyHashes: [\"" + ek + "\"]\n", both, "tpm-ek:" + ek, "deny.ekPublicKeyHashes: " + ek},
		{"ak of an ek-identified machine", "  akPublicKeyHashes: [\"" + ak + "\"]\n", both, "tpm-ek:" + ek, "deny.akPublicKeyHashes: " + ak},
		{"ek before ak", "  akPublicKeyHashes: [\"" + ak + "\"]\n  ekPublicKeyHashes: [\"" + ek + "\"]\n", both, "tpm-ek:" + ek,
			"deny.ekPublicKeyHashes: " + ek},
		{"another ak", "  akPublicKeyHashes: [\"" + other + "\"]\n", both, "tpm-ek:" + ek, ""},
		{"chip", "  snpChipIDs: [\"" + strings.Repeat("AB", 64) + "\"]\n", &snp.State{ChipID: chip}, "",
			"deny.snpChipIDs: " + strings.Repeat("ab", 64)},
		{"short chip id", "  snpChipIDs: [\"" + strings.Repeat("ab", 64) + "\"]\n", &snp.State{ChipID: chip[:63]}, "", ""},
		// A state with no keys (the double's) slips past the key check,
		// and is still caught by its machine identity.
		{"no keys, identity", "  ekPublicKeyHashes: [\"" + ek + "\"]\n", &attesttest.State{}, "tpm-ek:" + ek, "deny.ekPublicKeyHashes: " + ek},
		{"no state, identity", "  akPublicKeyHashes: [\"" + ak + "\"]\n", nil, "tpm-ak:" + ak, "deny.akPublicKeyHashes: " + ak},
	} {
		v := &attest.Verified{MachineID: tc.id, State: tc.state}
		if got := load(tc.deny).Match("node-1", "disk", v); got != tc.want {
			t.Errorf("%s: Match = %q, want %q", tc.name, got, tc.want)
		}
	}
}
