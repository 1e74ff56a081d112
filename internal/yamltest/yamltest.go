// Package yamltest writes the YAML files (policies, configurations) that
// tests and benchmarks hand to latchkey's loaders, marshalled by
// sigs.k8s.io/yaml as those loaders read them.
//
// Test-only: the shipped binaries must not link it (scripts/test.sh
// checks), and it imports nothing of the product's.
package yamltest

import (
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// Write writes v as YAML to path (mode 0600: a configuration may name
// secrets) and returns path; any failure fails the test.
func Write(tb testing.TB, path string, v any) string {
	tb.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}
