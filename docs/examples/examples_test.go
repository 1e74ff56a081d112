// Package examples holds the example configuration files the quickstart
// (docs/quickstart.md) installs. Its test loads every one of them with
// the programs' real loaders, so an example that stops parsing, or that
// the programs would refuse, fails CI.
package examples

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	agentconfig "github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/policy"
)

// loaders maps each example file to the check the program would run on
// it at start.
var loaders = map[string]func(t *testing.T, path string) error{
	"verifier.yaml":            loadVerifier(false),
	"verifier-kubernetes.yaml": loadVerifier(true),
	"agent.yaml":               loadAgent,
	"agent-kubernetes.yaml":    loadAgent,
	"policy.yaml":              loadPolicy,
}

func TestExamplesLoad(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name := range loaders {
		if !slices.Contains(files, name) {
			t.Errorf("%s is checked here but missing", name)
		}
	}
	quickstart, err := os.ReadFile(filepath.Join("..", "quickstart.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		load, ok := loaders[f]
		if !ok {
			t.Errorf("example %s is loaded by no test: add it to loaders", f)
			continue
		}
		if !strings.Contains(string(quickstart), "docs/examples/"+f) {
			t.Errorf("example %s is not used by docs/quickstart.md", f)
		}
		t.Run(f, func(t *testing.T) {
			if err := load(t, f); err != nil {
				t.Fatal(err)
			}
			// The check is not vacuous: the same file with a key the
			// programs do not know is refused.
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			bad := filepath.Join(t.TempDir(), f)
			if err := os.WriteFile(bad, append(data, "\nunknownKey: 1\n"...), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := load(t, bad); err == nil || !strings.Contains(err.Error(), "unknownKey") {
				t.Fatalf("%s with an unknown key: %v, want it refused by name", f, err)
			}
		})
	}
}

// loadVerifier reads the file as `latchkey-verifier serve` does and
// validates it, with the master secret the unit's credential would hold.
func loadVerifier(kube bool) func(t *testing.T, path string) error {
	return func(t *testing.T, path string) error {
		cfg, err := app.LoadConfig(path)
		if err != nil {
			return err
		}
		cred := t.TempDir()
		if err := os.WriteFile(filepath.Join(cred, "latchkey-master-secret"), []byte(strings.Repeat("k", 32)), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("CREDENTIALS_DIRECTORY", cred)
		if err := cfg.Validate(); err != nil {
			return err
		}
		if (cfg.Kubernetes != nil) != kube {
			return fmt.Errorf("kubernetes section present: %v, want %v", cfg.Kubernetes != nil, kube)
		}
		if cfg.Policy != "/etc/latchkey/policy.yaml" {
			return fmt.Errorf("policy %q: the quickstart installs it at /etc/latchkey/policy.yaml", cfg.Policy)
		}
		return nil
	}
}

// loadAgent reads the file as `latchkey-agent run` does (no kernel
// command line) and validates it.
func loadAgent(_ *testing.T, path string) error {
	f := agentconfig.Flags{ConfigPath: path, ConfigExplicit: true, CmdlinePath: "/dev/null", NodeName: "node-1"}
	cfg, err := f.Load()
	if err != nil {
		return err
	}
	return cfg.Validate()
}

// loadPolicy is `latchkey-verifier policy check`: it loads as the
// verifier would, and lints clean (fit to deploy).
func loadPolicy(_ *testing.T, path string) error {
	if _, err := policy.LoadFile(path, policy.Deps{}); err != nil {
		return err
	}
	data, err := policy.ReadFile(path)
	if err != nil {
		return err
	}
	p, err := policy.Parse(data)
	if err != nil {
		return err
	}
	if findings := policy.Lint(p); len(findings) > 0 {
		return fmt.Errorf("not fit to deploy: %v", findings)
	}
	return nil
}
