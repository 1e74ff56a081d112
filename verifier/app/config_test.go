package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A case-variant second clusterSalt used to win silently and change every
// disk key; it must be refused, as must an exact duplicate.
func TestLoadConfigRefusesCaseVariantAndDuplicateKeys(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"case variant", "clusterSalt: a\nclustersalt: b\n", `unknown field "clustersalt"`},
		{"duplicate", "clusterSalt: a\nclusterSalt: b\n", `key "clusterSalt" already set in map`},
		{"unknown", "clusterSalt: a\nlisten2: x\n", `unknown field "listen2"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "verifier.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfigAcceptsExactKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "verifier.yaml")
	if err := os.WriteFile(path, []byte("clusterSalt: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil || c.ClusterSalt != "a" {
		t.Fatalf("config %+v, err %v", c, err)
	}
}

// limits.challengeTimeout: strict key, 0 is the 5 s default, negative or
// longer than a whole join is refused at load.
func TestChallengeTimeoutConfig(t *testing.T) {
	load := func(t *testing.T, yaml string) (*Config, error) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "verifier.yaml")
		if err := os.WriteFile(path, []byte("policy: /p\nclusterSalt: a\n"+yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfig(path)
		if err != nil {
			return nil, err
		}
		return c, c.validateLimits()
	}
	for _, tc := range []struct{ yaml, want string }{
		{"limits: {challengeTimeout: -1s}\n", "limits.challengeTimeout -1s: want 0 (default 5s) or more"},
		{"limits: {challengeTimeout: 61s}\n", "limits.challengeTimeout 1m1s is longer than joinTimeout 1m0s"},
		{"joinTimeout: 10s\nlimits: {challengeTimeout: 11s}\n", "limits.challengeTimeout 11s is longer than joinTimeout 10s"},
		{"limits: {challengetimeout: 1s}\n", `unknown field "limits.challengetimeout"`},
	} {
		if _, err := load(t, tc.yaml); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
	c, err := load(t, "limits: {challengeTimeout: 2s}\n")
	if err != nil || c.Limits.ChallengeTimeout.Duration != 2*time.Second {
		t.Fatalf("2s: %+v %v", c.Limits, err)
	}
}
