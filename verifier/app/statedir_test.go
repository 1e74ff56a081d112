package app_test

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/verifier/app"
)

// TestUnwritableStateDirIsAConfigError: a state directory the verifier
// cannot create or write stops it with a configuration error naming
// stateDir (exit 2, not restarted), before it touches a file inside.
func TestUnwritableStateDirIsAConfigError(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		name  string
		state func(dir string) string
	}{
		// Tests run as root, which writes through any mode: a path that
		// cannot be a directory stands in for one it may not write.
		{"parent is a file", func(dir string) string { return filepath.Join(dir, "master", "state") }},
		{"state dir is a file", func(dir string) string { return filepath.Join(dir, "policy.yaml") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, cfg := verifierFiles(t, map[string]any{"tpm": map[string]any{"pcrs": map[string]any{}}}, randomSecret(), "state")
			cfg.StateDir = c.state(dir)
			_, err := app.New(cfg, app.Deps{Logger: quiet})
			if !errors.Is(err, app.ErrConfig) || !strings.Contains(err.Error(), "stateDir "+cfg.StateDir+" cannot be created") {
				t.Fatalf("New: %v, want a configuration error naming stateDir", err)
			}
		})
	}
	t.Run("writable state dir is created", func(t *testing.T) {
		dir, cfg := verifierFiles(t, map[string]any{"tpm": map[string]any{"pcrs": map[string]any{}}}, randomSecret(), "state")
		cfg.StateDir = filepath.Join(dir, "new", "state")
		if _, err := app.New(cfg, app.Deps{Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		left, err := os.ReadDir(cfg.StateDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range left {
			if strings.HasPrefix(e.Name(), ".write-check") {
				t.Errorf("the write check left %s behind", e.Name())
			}
		}
	})
	// With a configured certificate and bindings elsewhere, nothing lives
	// in the state directory: a bad one is no reason to refuse.
	t.Run("unused state dir is not checked", func(t *testing.T) {
		dir, cfg := verifierFiles(t, map[string]any{"tpm": map[string]any{"pcrs": map[string]any{}}}, randomSecret(), "state")
		cfg.TLSCert, cfg.TLSKey = pkitest.SelfSigned(t, "verifier").WriteFiles(t, dir, "tls.crt", "tls.key")
		cfg.Identity.BindingDir = filepath.Join(dir, "bindings")
		cfg.StateDir = filepath.Join(dir, "master", "state")
		if _, err := app.New(cfg, app.Deps{Logger: quiet}); err != nil {
			t.Fatalf("New with no use for the state directory: %v", err)
		}
	})
}
