package policy

import (
	"bytes"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx"
	"github.com/latchkey/latchkey/attest/tdx/issuer"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// TestTDXSection loads a tdx section (RTMRs are a list of lists) into a
// TDX validator, and refuses what the strict parser and the TDX compiler
// refuse.
func TestTDXSection(t *testing.T) {
	m := strings.Repeat("ab", 48)
	good := "apiVersion: latchkey/v1\ntdx:\n  mrtds: [\"" + m + "\"]\n  rtmrs:\n    - [\"" + m + "\"]\n    - [\"" + m + "\", \"" + strings.Repeat("cd", 48) + "\"]\n" +
		"  tcbStatuses: [UpToDate, SWHardeningNeeded]\n  allowControlPlane: true\n"
	s, err := Load([]byte(good), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if v := s.Validators[latchkeyv1.Variant_VARIANT_TDX]; v == nil || v.Variant() != latchkeyv1.Variant_VARIANT_TDX || !s.ControlPlane[latchkeyv1.Variant_VARIANT_TDX] {
		t.Fatalf("validators %v, control plane %v", s.Validators, s.ControlPlane)
	}
	for _, tc := range []struct{ name, policy, want string }{
		{"unknown key", "apiVersion: latchkey/v1\ntdx:\n  mrtd: [\"" + m + "\"]\n", `unknown field "tdx.mrtd"`},
		{"case variant", "apiVersion: latchkey/v1\ntdx:\n  MRTDs: [\"" + m + "\"]\n", "MRTDs"},
		{"short mrtd", "apiVersion: latchkey/v1\ntdx:\n  mrtds: [\"abcd\"]\n", "tdx policy: mrtds[0]: 2 bytes, want 48"},
		{"five rtmrs", "apiVersion: latchkey/v1\ntdx:\n  rtmrs: [[], [], [], [], []]\n", "tdx policy: rtmrs: 5 lists, a TD has 4 RTMRs"},
		{"revoked status", "apiVersion: latchkey/v1\ntdx:\n  tcbStatuses: [Revoked]\n", `tdx policy: tcbStatuses[0]: "Revoked" is not one of`},
		{"bad root", "apiVersion: latchkey/v1\ntdx:\n  trustedRoots: [\"x\"]\n", "tdx policy: trustedRoots[0]: want one PEM certificate"},
		{"judged and listed", "apiVersion: latchkey/v1\ntdx:\n  rtmrs: [[], [\"" + m + "\"]]\n  boot: {ukis: [\"sha384:" + m + "\"], judgedRTMRs: [1]}\n", "tdx policy: rtmrs[1]: RTMR[1] is judged by boot components (boot.judgedRTMRs); list values or judge it, not both"},
		{"judged rtmr 3", "apiVersion: latchkey/v1\ntdx:\n  boot: {ukis: [\"sha384:" + m + "\"], judgedRTMRs: [3]}\n", "tdx policy: boot.judgedRTMRs[0]: RTMR[3] cannot be judged by components (only 1 and 2)"},
		{"judged case variant", "apiVersion: latchkey/v1\ntdx:\n  boot: {ukis: [\"sha384:" + m + "\"], judgedRtmrs: [1]}\n", "judgedRtmrs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.policy), Deps{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestDenyTDX denies a TDX platform by its PPID (a state key) and by
// machine identity, with or without the MRCONFIGID part.
func TestDenyTDX(t *testing.T) {
	ppid := strings.Repeat("0f", 16)
	cfg := strings.Repeat("11", 48)
	st := &tdx.State{PPID: bytes.Repeat([]byte{0x0f}, 16)}
	for _, tc := range []struct{ name, deny, id, want string }{
		{"ppid key", "  tdxPPIDs: [\"" + strings.ToUpper(ppid) + "\"]\n", "tdx-ppid:" + ppid, "deny.tdxPPIDs: " + ppid},
		{"ppid under mrconfigid identity", "  tdxPPIDs: [\"" + ppid + "\"]\n", "tdx-ppid:" + ppid + "/mrconfigid:" + cfg, "deny.tdxPPIDs: " + ppid},
		{"machine id", "  machineIDs: [\"tdx-ppid:" + ppid + "/mrconfigid:" + cfg + "\"]\n", "tdx-ppid:" + ppid + "/mrconfigid:" + cfg, "deny.machineIDs: tdx-ppid:" + ppid + "/mrconfigid:" + cfg},
		{"other platform", "  tdxPPIDs: [\"" + strings.Repeat("aa", 16) + "\"]\n", "tdx-ppid:" + ppid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Load([]byte("apiVersion: latchkey/v1\ntdx: {}\ndeny:\n"+tc.deny), Deps{})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Deny.Match("n", "", &attest.Verified{MachineID: tc.id, State: st}); got != tc.want {
				t.Errorf("Match = %q, want %q", got, tc.want)
			}
			if tc.want != "" && s.Deny.MatchIdentity(tc.id) == "" {
				t.Errorf("MatchIdentity(%s) matches nothing", tc.id)
			}
		})
	}
	for _, bad := range []string{"  tdxPPIDs: [\"abcd\"]\n", "  machineIDs: [\"tdx-ppid:" + ppid + "/mrconfigid:ab\"]\n", "  machineIDs: [\"tdx-ppid:" + strings.ToUpper(ppid) + "\"]\n"} {
		if _, err := Load([]byte("apiVersion: latchkey/v1\ntdx: {}\ndeny:\n"+bad), Deps{}); err == nil {
			t.Errorf("deny %q loaded", bad)
		}
	}
}

// TestTDXMeasureSnippet loads what `latchkey-agent measure` prints for a
// TD as the verifier's tdx section: the field names of the agent's
// snippet (attest/tdx/issuer.Values) are the policy's.
func TestTDXMeasureSnippet(t *testing.T) {
	m := strings.Repeat("ab", 48)
	out, err := yaml.Marshal(map[string]any{"apiVersion": APIVersion, "tdx": &issuer.Values{
		MRTDs: []string{m}, RTMRs: [][]string{{m}, {m}, {m}, {m}}, Attributes: []string{"0000004000000000"},
		XFAMs: []string{"e71a060000000000"}, MRConfigIDs: []string{m}, MROwners: []string{m}, MROwnerConfigs: []string{m},
		MinimumTeeTcbSvn: "03000400000000000000000000000000",
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(out, Deps{}); err != nil {
		t.Fatalf("Load(measure snippet) = %v\n%s", err, out)
	}
}
