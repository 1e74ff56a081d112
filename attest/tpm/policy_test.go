package tpm_test

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest/tpm"
)

var digest = strings.Repeat("ab", 32)

func TestNewValidatorAcceptsGoodPolicy(t *testing.T) {
	for name, p := range map[string]tpm.Policy{
		"zero value": {},
		"full": {
			PCRs:              map[int][]string{0: {digest, strings.ToUpper(digest)}, 23: {digest}},
			EKCARoots:         []string{otherCAPEM(t), "subject=CN = two in one\n" + otherCAPEM(t) + otherCAPEM(t)},
			EKPublicKeyHashes: []string{"sha256:" + digest},
			AKPublicKeyHashes: []string{"sha256:" + digest},
		},
	} {
		if _, err := tpm.NewValidator(p); err != nil {
			t.Errorf("%s: NewValidator: %v", name, err)
		}
	}
}

func TestNewValidatorRefusesBadPolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		p    tpm.Policy
		want string // a fragment the error must contain
	}{
		"short digest":       {tpm.Policy{PCRs: map[int][]string{7: {"abcd"}}}, "pcrs[7]"},
		"sha-1 digest":       {tpm.Policy{PCRs: map[int][]string{7: {strings.Repeat("ab", 20)}}}, "pcrs[7]"},
		"non-hex digest":     {tpm.Policy{PCRs: map[int][]string{7: {strings.Repeat("zz", 32)}}}, "pcrs[7]"},
		"empty pcr list":     {tpm.Policy{PCRs: map[int][]string{7: {}}}, "empty list"},
		"pcr index 24":       {tpm.Policy{PCRs: map[int][]string{24: {digest}}}, "out of range"},
		"negative pcr":       {tpm.Policy{PCRs: map[int][]string{-1: {digest}}}, "out of range"},
		"bad pem":            {tpm.Policy{EKCARoots: []string{"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}}, "ekCARoots[0]"},
		"not pem":            {tpm.Policy{EKCARoots: []string{"hello"}}, "ekCARoots[0]"},
		"pem private key":    {tpm.Policy{EKCARoots: []string{"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}}, "not a CERTIFICATE"},
		"trailing text":      {tpm.Policy{EKCARoots: []string{otherCAPEM(t) + "junk"}}, "ekCARoots[0]"},
		"ek hash no prefix":  {tpm.Policy{EKPublicKeyHashes: []string{digest}}, "ekPublicKeyHashes"},
		"ak hash short":      {tpm.Policy{AKPublicKeyHashes: []string{"sha256:abcd"}}, "akPublicKeyHashes"},
		"second root is bad": {tpm.Policy{EKCARoots: []string{otherCAPEM(t), "x"}}, "ekCARoots[1]"},
	} {
		_, err := tpm.NewValidator(tc.p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", name, err, tc.want)
		}
	}
}

// The policy file is read with sigs.k8s.io/yaml UnmarshalStrict: integer
// PCR keys and camelCase fields must round-trip, unknown fields fail.
func TestPolicyYAML(t *testing.T) {
	doc := "pcrs:\n  7: [" + digest + "]\n  14:\n  - " + digest + "\nekPublicKeyHashes: [\"sha256:" + digest + "\"]\n"
	var p tpm.Policy
	if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
		t.Fatalf("UnmarshalStrict: %v", err)
	}
	if len(p.PCRs[7]) != 1 || len(p.PCRs[14]) != 1 || len(p.EKPublicKeyHashes) != 1 {
		t.Fatalf("parsed %+v", p)
	}
	out, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back tpm.Policy
	if err := yaml.UnmarshalStrict(out, &back); err != nil || len(back.PCRs) != 2 {
		t.Fatalf("round trip of %s: %+v, %v", out, back, err)
	}
	if err := yaml.UnmarshalStrict([]byte("pcr: {}\n"), &p); err == nil {
		t.Error("unknown field accepted")
	}
}
