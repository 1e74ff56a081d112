package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeSecret(t *testing.T, dir, name string, b byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, bytes.Repeat([]byte{b}, 32), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// masterSecrets is loaded strictly and checked as a whole; every file is
// checked like masterSecretFile.
func TestMasterSecretsConfig(t *testing.T) {
	dir := t.TempDir()
	s0 := writeSecret(t, dir, "s0", 1, 0o600)
	s1 := writeSecret(t, dir, "s1", 2, 0o600)
	open := writeSecret(t, dir, "open", 3, 0o644)
	for _, tc := range []struct{ name, yaml, want string }{
		{"both forms", "masterSecretFile: " + s0 + "\nmasterSecrets:\n- {generation: 1, file: " + s1 + ", current: true}\n",
			"masterSecretFile and masterSecrets are mutually exclusive"},
		{"no current", "masterSecrets:\n- {generation: 0, file: " + s0 + "}\n- {generation: 1, file: " + s1 + "}\n",
			"0 entries are marked current: true, want exactly one"},
		{"two current", "masterSecrets:\n- {generation: 0, file: " + s0 + ", current: true}\n- {generation: 1, file: " + s1 + ", current: true}\n",
			"2 entries are marked current: true, want exactly one"},
		{"duplicate", "masterSecrets:\n- {generation: 1, file: " + s0 + "}\n- {generation: 1, file: " + s1 + ", current: true}\n",
			"masterSecrets[1]: generation 1 is listed twice"},
		{"no generation", "masterSecrets:\n- {file: " + s1 + ", current: true}\n", "masterSecrets[0]: generation is required"},
		{"case variant key", "masterSecrets:\n- {Generation: 1, file: " + s1 + ", current: true}\n", `unknown field "masterSecrets[0].Generation"`},
		{"unknown key", "masterSecrets:\n- {generation: 1, path: " + s1 + ", current: true}\n", `unknown field "masterSecrets[0].path"`},
		{"world-readable", "masterSecrets:\n- {generation: 0, file: " + s0 + "}\n- {generation: 1, file: " + open + ", current: true}\n",
			"generation 1: master secret " + open + " is readable or writable by group or others (mode 0644): run `chmod 0600 " + open + "`"},
		{"same secret twice", "masterSecrets:\n- {generation: 0, file: " + s0 + "}\n- {generation: 1, file: " + s0 + ", current: true}\n",
			"generations 0 and 1 hold the same secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "verifier.yaml")
			if err := os.WriteFile(path, []byte("clusterSalt: c\n"+tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(path)
			if err == nil {
				var d interface{ Close() }
				d, err = Deriver(cfg)
				if err == nil {
					d.Close()
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	path := filepath.Join(dir, "ok.yaml")
	os.WriteFile(path, []byte("clusterSalt: c\nmasterSecrets:\n- {generation: 0, file: "+s0+"}\n- {generation: 1, file: "+s1+", current: true}\n"), 0o600)
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Deriver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Current() != 1 || len(d.Generations()) != 2 {
		t.Fatalf("current %d, generations %+v", d.Current(), d.Generations())
	}
	// masterSecretFile is generation 0, current.
	cfg = &Config{ClusterSalt: "c", MasterSecretFile: s0}
	d0, err := Deriver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d0.Close()
	if d0.Current() != 0 || d0.KeyID() != d.KeyIDAt(0) {
		t.Fatalf("masterSecretFile: current %d, key id %s, want generation 0 with %s", d0.Current(), d0.KeyID(), d.KeyIDAt(0))
	}
}

// A generation without a file comes from the credential
// latchkey-master-secret.<n>.
func TestMasterSecretsFromCredentials(t *testing.T) {
	dir := t.TempDir()
	writeSecret(t, dir, "latchkey-master-secret.0", 1, 0o600)
	writeSecret(t, dir, "latchkey-master-secret.4", 2, 0o600)
	t.Setenv("CREDENTIALS_DIRECTORY", dir)
	zero, four := uint32(0), uint32(4)
	d, err := Deriver(&Config{ClusterSalt: "c", MasterSecrets: []MasterSecret{{Generation: &zero}, {Generation: &four, Current: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Current() != 4 || !d.Serves(0) {
		t.Fatalf("current %d", d.Current())
	}
	five := uint32(5)
	if _, err := Deriver(&Config{ClusterSalt: "c", MasterSecrets: []MasterSecret{{Generation: &five, Current: true}}}); err == nil ||
		!strings.Contains(err.Error(), "generation 5") || !strings.Contains(err.Error(), "latchkey-master-secret.5") {
		t.Fatalf("missing credential: %v", err)
	}
}
