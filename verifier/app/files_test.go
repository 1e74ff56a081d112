package app_test

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/latchkey/latchkey/internal/yamltest"
	"github.com/latchkey/latchkey/verifier/app"
)

// verifierFiles writes what the assembled verifier reads into a fresh
// temporary directory: pol (its apiVersion set to latchkey/v1) as
// policy.yaml and master as the master secret file. It returns the
// directory and a config naming them, with clusterSalt salt, its state in
// dir/state and no admin socket, for the test to complete.
func verifierFiles(tb testing.TB, pol map[string]any, master []byte, salt string) (string, *app.Config) {
	tb.Helper()
	dir := tb.TempDir()
	pol["apiVersion"] = "latchkey/v1"
	yamltest.Write(tb, filepath.Join(dir, "policy.yaml"), pol)
	if err := os.WriteFile(filepath.Join(dir, "master"), master, 0o600); err != nil {
		tb.Fatal(err)
	}
	return dir, &app.Config{Policy: filepath.Join(dir, "policy.yaml"), MasterSecretFile: filepath.Join(dir, "master"),
		ClusterSalt: salt, StateDir: filepath.Join(dir, "state"), AdminSocket: "-"}
}

// randomSecret is a new 32-byte master secret.
func randomSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}
