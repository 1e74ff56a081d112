package policy

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

const digestA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
const digestB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

func tpmPolicy(pcr7 ...string) string {
	return "apiVersion: latchkey/v1\ntpm:\n  allowControlPlane: true\n  pcrs:\n    \"7\": [" + strings.Join(pcr7, ", ") + "]\n" +
		"  akPublicKeyHashes: [\"sha256:" + digestA + "\"]\n"
}

func TestLoadGood(t *testing.T) {
	snap, err := Load([]byte(tpmPolicy(digestA, digestB)), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := snap.Validators[latchkeyv1.Variant_VARIANT_TPM]; !ok || !snap.ControlPlane[latchkeyv1.Variant_VARIANT_TPM] {
		t.Fatalf("snapshot %+v", snap)
	}
	if _, ok := snap.Validators[latchkeyv1.Variant_VARIANT_SNP]; ok {
		t.Fatal("snp enabled without a section")
	}
	if !strings.HasPrefix(snap.Digest, "sha256:") || len(snap.Digest) != 71 {
		t.Fatalf("digest %q", snap.Digest)
	}
}

func TestLoadRefusals(t *testing.T) {
	cases := map[string]struct{ policy, want string }{
		"unknown field":        {tpmPolicy(digestA) + "  pcr: {}\n", `unknown field "tpm.pcr"`},
		"unknown top field":    {tpmPolicy(digestA) + "sgx: {}\n", `unknown field "sgx"`},
		"bad digest":           {tpmPolicy("abcd"), `pcrs[7]: "abcd" is not a sha-256 digest`},
		"wrong version":        {strings.Replace(tpmPolicy(digestA), "latchkey/v1", "latchkey/v2", 1), `apiVersion "latchkey/v2"`},
		"no variant":           {"apiVersion: latchkey/v1\n", "enables no evidence variant"},
		"scalar not a list":    {strings.Replace(tpmPolicy(digestA), "["+digestA+"]", digestA, 1), `key "tpm.pcrs": want a list, got string`},
		"case-variant field":   {strings.Replace(tpmPolicy(digestA), "allowControlPlane", "allowcontrolplane", 1), `unknown field "tpm.allowcontrolplane"`},
		"not yaml":             {"\x00\x01{{{", "parse policy"},
		"case-variant section": {tpmPolicy(digestA) + "TPM: {}\n", `unknown field "TPM"`},
		"duplicate section":    {tpmPolicy(digestA) + "tpm: {}\n", `key "tpm" already set in map`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load([]byte(c.policy), Deps{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestStoreHotReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(path, []byte(tpmPolicy(digestA)), 0o600)
	var logs bytes.Buffer
	var reloads []string
	s, err := NewStore(StoreConfig{Path: path, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnReload: func(d string, err error) { reloads = append(reloads, d) }})
	if err != nil {
		t.Fatal(err)
	}
	first := s.Current()
	s.Reload()
	if s.Current() != first || len(reloads) != 0 {
		t.Fatal("unchanged file reloaded")
	}
	os.WriteFile(path, []byte(tpmPolicy(digestA, digestB)), 0o600)
	s.Reload()
	second := s.Current()
	if second == first || second.Digest == first.Digest || len(reloads) != 1 {
		t.Fatal("a valid change did not take effect")
	}
	os.WriteFile(path, []byte(tpmPolicy("not-hex")), 0o600)
	s.Reload()
	if s.Current() != second {
		t.Fatal("an invalid change replaced the policy in force")
	}
	if !strings.Contains(logs.String(), "policy reload refused; the policy in force stays") || len(reloads) != 2 || reloads[1] != "" {
		t.Fatalf("refused reload not reported: %v\n%s", reloads, logs.String())
	}
}

func TestNewStoreRefusesBadInitialFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(path, []byte("apiVersion: latchkey/v1\n"), 0o600)
	if _, err := NewStore(StoreConfig{Path: path}); err == nil || !strings.Contains(err.Error(), "enables no evidence variant") {
		t.Fatalf("err = %v", err)
	}
	if _, err := NewStore(StoreConfig{Path: filepath.Join(t.TempDir(), "absent")}); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestReadFileRefusesHugeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	os.WriteFile(path, bytes.Repeat([]byte("#"), MaxFileSize+1), 0o600)
	if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("err = %v", err)
	}
}

// The component policy is strict YAML like the rest: unknown, duplicate
// and case-variant keys under tpm.boot are errors, and entries compile.
func TestBootSection(t *testing.T) {
	boot := tpmPolicy(digestA) + "  boot:\n    ukis: [\"sha256:" + digestB + "\"]\n    kernelCmdlines: [\"console=ttyS0\"]\n    secureBoot:\n      allowDisabled: true\n    pcr11Phases: [sysinit]\n"
	if _, err := Load([]byte(boot), Deps{}); err != nil {
		t.Fatalf("boot section refused: %v", err)
	}
	for name, c := range map[string]struct{ policy, want string }{
		"unknown boot field": {boot + "    uki: []\n", `unknown field "tpm.boot.uki"`},
		"case variant":       {boot + "    UKIs: []\n", `unknown field "tpm.boot.UKIs"`},
		"duplicate":          {boot + "    ukis: []\n", `key "tpm.boot.ukis" already set in map`},
		"unknown secureBoot": {strings.Replace(boot, "allowDisabled", "allowdisabled", 1), `unknown field "tpm.boot.secureBoot.allowdisabled"`},
		"bad uki":            {strings.Replace(boot, "sha256:"+digestB, "sha256:zz", 1), `boot.ukis[0]: "sha256:zz" is not`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load([]byte(c.policy), Deps{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// TestStoreLogsABadFileOncePerContent: a bad file is logged and counted
// once, not at every poll; another bad content is logged again; a fix is
// logged, also when it restores the policy in force byte for byte.
func TestStoreLogsABadFileOncePerContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	good := tpmPolicy(digestA)
	os.WriteFile(path, []byte(good), 0o600)
	var logs bytes.Buffer
	var reloads []string
	s, err := NewStore(StoreConfig{Path: path, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnReload: func(d string, err error) { reloads = append(reloads, d) }})
	if err != nil {
		t.Fatal(err)
	}
	count := func(msg string) int { return strings.Count(logs.String(), msg) }
	const refused, fixed = "policy reload refused", "policy file fixed; reloads resume"

	os.WriteFile(path, []byte(tpmPolicy("not-hex")), 0o600)
	for range 5 {
		s.Reload()
	}
	if count(refused) != 1 || len(reloads) != 1 {
		t.Fatalf("one bad content polled 5 times: %d log lines, %d reload reports\n%s", count(refused), len(reloads), logs.String())
	}
	os.WriteFile(path, []byte(tpmPolicy("still-not-hex")), 0o600)
	s.Reload()
	s.Reload()
	if count(refused) != 2 || len(reloads) != 2 {
		t.Fatalf("a second bad content: %d log lines, %d reload reports", count(refused), len(reloads))
	}
	os.Remove(path)
	s.Reload()
	s.Reload()
	if count(refused) != 3 || !strings.Contains(logs.String(), "no such file") {
		t.Fatalf("a removed file: %d log lines\n%s", count(refused), logs.String())
	}
	// Reverted to the policy in force: nothing to install, but the fix is
	// logged and reported (as a good reload) once.
	os.WriteFile(path, []byte(good), 0o600)
	s.Reload()
	s.Reload()
	if count(fixed) != 1 || len(reloads) != 4 || reloads[3] != s.Current().Digest {
		t.Fatalf("revert to the policy in force: %d fix lines, %d reload reports\n%s", count(fixed), len(reloads), logs.String())
	}
	// A bad file, then a new good one: the fix line names the new digest.
	os.WriteFile(path, []byte(tpmPolicy("not-hex")), 0o600)
	s.Reload()
	os.WriteFile(path, []byte(tpmPolicy(digestA, digestB)), 0o600)
	s.Reload()
	if count(fixed) != 2 || s.Current().Digest == "" || !strings.Contains(logs.String(), "policy="+s.Current().Digest) {
		t.Fatalf("fixed by a new policy: %d fix lines\n%s", count(fixed), logs.String())
	}
	if count("policy reloaded") != 0 {
		t.Fatalf("the fix was also logged as a plain reload\n%s", logs.String())
	}
}
