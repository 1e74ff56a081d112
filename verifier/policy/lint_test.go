package policy

import (
	"strings"
	"testing"
)

func TestLintFindsUselessAndUnsafePolicies(t *testing.T) {
	const pcr = "ab" // digest syntax is Parse's job, not Lint's
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"trusts nothing", "apiVersion: latchkey/v1\ntpm:\n  pcrs: {7: [" + pcr + "]}\n", "tpm: trusts no key"},
		{"checks nothing", "apiVersion: latchkey/v1\ntpm:\n  ekPublicKeyHashes: [x]\n", "tpm: checks no measurement"},
		{"resettable pcr", "apiVersion: latchkey/v1\ntpm:\n  ekPublicKeyHashes: [x]\n  pcrs: {23: [" + pcr + "]}\n", "tpm: pcrs.23 can be reset by software"},
		{"snp measures nothing", "apiVersion: latchkey/v1\nsnp: {}\n", "snp: lists no launch measurement"},
		{"tdx lists no mrtd", "apiVersion: latchkey/v1\ntdx: {}\n", "tdx: lists no MRTD"},
		{"tdx boot admits no application", "apiVersion: latchkey/v1\ntdx:\n  mrtds: [\"" + strings.Repeat("ab", 48) + "\"]\n  boot: {secureBoot: {allowDisabled: true}}\n", "tdx: boot lists no ukis and no bootLoaders"},
		{"tdx judged rtmrs, no rtmr 0", "apiVersion: latchkey/v1\ntdx:\n  mrtds: [\"" + strings.Repeat("ab", 48) + "\"]\n  boot: {ukis: [x], judgedRTMRs: [1, 2]}\n", "tdx: boot.judgedRTMRs judges RTMR[1]/RTMR[2] but rtmrs lists no RTMR[0] value"},
		{"tdx debug", "apiVersion: latchkey/v1\ntdx:\n  mrtds: [\"" + strings.Repeat("ab", 48) + "\"]\n  allowDebug: true\n", "tdx: allowDebug admits debug TDs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(Lint(p), "\n")
			if !strings.Contains(got, tc.want) {
				t.Fatalf("lint = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLintPassesASoundPolicy(t *testing.T) {
	p, err := Parse([]byte("apiVersion: latchkey/v1\ntpm:\n  ekPublicKeyHashes: [x]\n  pcrs: {7: [ab]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := Lint(p); len(l) != 0 {
		t.Fatalf("lint = %v", l)
	}
}

func TestLintPassesAJudgedTDXPolicy(t *testing.T) {
	ab := `"` + strings.Repeat("ab", 48) + `"`
	p, err := Parse([]byte("apiVersion: latchkey/v1\ntdx:\n  mrtds: [" + ab + "]\n  rtmrs: [[" + ab + "]]\n  boot: {ukis: [x], judgedRTMRs: [1, 2]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := Lint(p); len(l) != 0 {
		t.Fatalf("lint = %v", l)
	}
}
