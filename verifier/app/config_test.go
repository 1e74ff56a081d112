package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
