package yamltest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteMarshalsPrivately(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if got := Write(t, path, map[string]any{"clusterSalt": "s", "limits": map[string]int{"maxJoinsInFlight": 3}}); got != path {
		t.Fatalf("Write returned %q, want %q", got, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "clusterSalt: s\nlimits:\n  maxJoinsInFlight: 3\n"; string(b) != want {
		t.Fatalf("wrote %q, want %q", b, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}
