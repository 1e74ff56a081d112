package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const diskUUID = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestSecretInitThenIDThenNoOverwrite(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "master")
	if code, out, errs := runCLI(t, "secret", "init", secret); code != 0 || !strings.Contains(out, "mode 0600") {
		t.Fatalf("init: code %d, out %q, err %q", code, out, errs)
	}
	before, _ := os.ReadFile(secret)
	code, _, errs := runCLI(t, "secret", "init", secret)
	if code != 1 || !strings.Contains(errs, "already exists; it is never overwritten") {
		t.Fatalf("second init: code %d, err %q", code, errs)
	}
	if after, _ := os.ReadFile(secret); !bytes.Equal(before, after) {
		t.Fatal("second init changed the secret")
	}
	code, id1, errs := runCLI(t, "secret", "id", "--master-secret-file", secret, "--cluster-salt", "c1")
	if code != 0 || !strings.HasPrefix(id1, "kid-") {
		t.Fatalf("id: code %d, out %q, err %q", code, id1, errs)
	}
	if _, id2, _ := runCLI(t, "secret", "id", "--master-secret-file", secret, "--cluster-salt", "c1"); id2 != id1 {
		t.Fatalf("key id not stable: %q vs %q", id1, id2)
	}
	if strings.Contains(id1, string(before)) {
		t.Fatal("key id shows the secret")
	}
}

func TestSecretIDRefusesWorldReadableSecret(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "master")
	os.WriteFile(secret, bytes.Repeat([]byte{7}, 32), 0o600)
	os.Chmod(secret, 0o644)
	code, _, errs := runCLI(t, "secret", "id", "--master-secret-file", secret, "--cluster-salt", "c1")
	if code != 2 || !strings.Contains(errs, "run `chmod 0600 "+secret+"`") {
		t.Fatalf("code %d, err %q", code, errs)
	}
}

func TestRecoverKeyRefusesBadUsage(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "master")
	os.WriteFile(secret, bytes.Repeat([]byte{7}, 32), 0o600)
	for name, args := range map[string][]string{
		"upper-case uuid": {"--disk-uuid", strings.ToUpper(diskUUID), "--out", "x"},
		"no out":          {"--disk-uuid", diskUUID},
	} {
		code, _, errs := runCLI(t, append([]string{"recover-key", "--master-secret-file", secret, "--cluster-salt", "c"}, args...)...)
		if code != 2 || !strings.Contains(errs, "usage: latchkey-verifier recover-key") {
			t.Errorf("%s: code %d, err %q", name, code, errs)
		}
	}
}

// The recovered key opens a real LUKS2 header that was made with the key
// the verifier hands out for that disk, and is written only to a new
// 0600 file.
func TestRecoverKeyOpensTheDisk(t *testing.T) {
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Skip("cryptsetup not installed (apt-get install cryptsetup-bin)")
	}
	dir := t.TempDir()
	secret := filepath.Join(dir, "master")
	if code, _, errs := runCLI(t, "secret", "init", secret); code != 0 {
		t.Fatal(errs)
	}
	common := []string{"--master-secret-file", secret, "--cluster-salt", "cluster-1"}
	// The verifier's key for the disk, as a join would receive it.
	served, code := deriverFromConfig("test", &serveFlags{masterSecret: secret, salt: "cluster-1"}, os.Stderr)
	if served == nil {
		t.Fatalf("deriver: code %d", code)
	}
	key, err := served.DiskKey(diskUUID)
	served.Close()
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(img, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	format := exec.Command("cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--uuid", diskUUID,
		"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file", "-", img)
	format.Stdin = bytes.NewReader(key)
	if out, err := format.CombinedOutput(); err != nil {
		t.Fatalf("luksFormat: %v: %s", err, out)
	}
	keyFile := filepath.Join(dir, "recovered.key")
	code, out, errs := runCLI(t, append([]string{"recover-key", "--disk-uuid", diskUUID, "--out", keyFile}, common...)...)
	if code != 0 || out != "" || !strings.Contains(errs, "derived the key of disk "+diskUUID) {
		t.Fatalf("recover-key: code %d, out %q, err %q", code, out, errs)
	}
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o600 || st.Size() != 32 {
		t.Fatalf("key file: %v %v", st, err)
	}
	open := exec.Command("cryptsetup", "open", "--test-passphrase", "--key-file", keyFile, img)
	if out, err := open.CombinedOutput(); err != nil {
		t.Fatalf("recovered key does not open the disk: %v: %s", err, out)
	}
	code, _, errs = runCLI(t, append([]string{"recover-key", "--disk-uuid", diskUUID, "--out", keyFile}, common...)...)
	if code != 1 || !strings.Contains(errs, "must not exist yet") {
		t.Fatalf("overwrite: code %d, err %q", code, errs)
	}
}

// With several generations configured, recover-key derives under the one
// --generation names and refuses to guess without it; secret id lists
// every generation's key ID.
func TestRecoverKeyGenerations(t *testing.T) {
	dir := t.TempDir()
	s0, s1 := filepath.Join(dir, "s0"), filepath.Join(dir, "s1")
	for _, s := range []string{s0, s1} {
		if code, _, errs := runCLI(t, "secret", "init", "--generation", "1", s); code != 0 {
			t.Fatal(errs)
		}
	}
	cfg := filepath.Join(dir, "verifier.yaml")
	os.WriteFile(cfg, []byte("clusterSalt: c\nmasterSecrets:\n- {generation: 0, file: "+s0+"}\n- {generation: 1, file: "+s1+", current: true}\n"), 0o600)
	code, _, errs := runCLI(t, "recover-key", "--config", cfg, "--disk-uuid", diskUUID, "--out", filepath.Join(dir, "k"))
	if code != 2 || !strings.Contains(errs, "masterSecrets lists generations 0, 1: say which one with --generation N") {
		t.Fatalf("no --generation: code %d, %q", code, errs)
	}
	code, _, errs = runCLI(t, "recover-key", "--config", cfg, "--disk-uuid", diskUUID, "--generation", "7", "--out", filepath.Join(dir, "k"))
	if code != 2 || !strings.Contains(errs, "generation 7 is not in masterSecrets (configured: 0, 1)") {
		t.Fatalf("unknown generation: code %d, %q", code, errs)
	}
	d, _ := deriverFromConfig("test", &serveFlags{config: cfg}, os.Stderr)
	defer d.Close()
	for _, gen := range []uint32{0, 1} {
		out := filepath.Join(dir, fmt.Sprintf("k%d", gen))
		code, _, errs := runCLI(t, "recover-key", "--config", cfg, "--disk-uuid", diskUUID, "--generation", fmt.Sprint(gen), "--out", out)
		if code != 0 || !strings.Contains(errs, fmt.Sprintf("under generation %d (%s)", gen, d.KeyIDAt(gen))) {
			t.Fatalf("generation %d: code %d, %q", gen, code, errs)
		}
		got, _ := os.ReadFile(out)
		want, _ := d.DiskKeyAt(gen, diskUUID)
		if !bytes.Equal(got, want) {
			t.Fatalf("generation %d: recovered another key", gen)
		}
	}
	code, out, _ := runCLI(t, "secret", "id", "--config", cfg)
	want := fmt.Sprintf("generation 0 %s\ngeneration 1 %s current\n", d.KeyIDAt(0), d.KeyIDAt(1))
	if code != 0 || out != want {
		t.Fatalf("secret id: %d %q, want %q", code, out, want)
	}
}
