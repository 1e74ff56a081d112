package keys

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInitMasterSecretCreatesPrivateSecretAndNeverOverwrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "master")
	if err := InitMasterSecret(path); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Size() != MinMasterSecretSize {
		t.Fatalf("mode %v size %d, want 0600 and %d bytes", st.Mode().Perm(), st.Size(), MinMasterSecretSize)
	}
	first, _ := os.ReadFile(path)
	err = InitMasterSecret(path)
	if !errors.Is(err, ErrSecretExists) {
		t.Fatalf("second init: %v, want ErrSecretExists", err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(first) {
		t.Fatal("second init changed the secret")
	}
	if b, err := LoadMasterSecret(path); err != nil || len(b) != MinMasterSecretSize {
		t.Fatalf("load: %d bytes, %v", len(b), err)
	}
}

func TestLoadMasterSecretRefusesReadableByOthers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "master")
	if err := os.WriteFile(path, make([]byte, 32), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o644) // the umask may have narrowed it
	_, err := LoadMasterSecret(path)
	want := "is readable or writable by group or others (mode 0644): run `chmod 0600 " + path + "`"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want %q", err, want)
	}
}

func TestLoadMasterSecretRefusesShortSecretWithTheFix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "master")
	os.WriteFile(path, []byte("short\n"), 0o600)
	_, err := LoadMasterSecret(path)
	if err == nil || !strings.Contains(err.Error(), "is 6 bytes, want at least 32") ||
		!strings.Contains(err.Error(), "latchkey-verifier secret init") {
		t.Fatalf("err = %v", err)
	}
}

func TestKeyIDNamesSecretAndSaltWithoutRevealingKeys(t *testing.T) {
	a := []byte(strings.Repeat("a", 32))
	d1, _ := NewDeriver(a, []byte("salt"))
	d2, _ := NewDeriver(a, []byte("salt"))
	d3, _ := NewDeriver(append(a, '\n'), []byte("salt"))
	d4, _ := NewDeriver(a, []byte("other"))
	id := d1.KeyID()
	if len(id) != len("kid-")+16 || !strings.HasPrefix(id, "kid-") {
		t.Fatalf("key id %q", id)
	}
	if d2.KeyID() != id {
		t.Fatal("same secret and salt, different key ids")
	}
	if d3.KeyID() == id || d4.KeyID() == id {
		t.Fatal("a trailing newline or another salt must show another key id")
	}
}

func TestLooksLikeText(t *testing.T) {
	for in, want := range map[string]bool{
		"correct horse battery staple xx\n": true,
		"\x00\x01binary\n":                  false,
		"no newline at all, printable text": false,
		"":                                  false,
	} {
		if got := LooksLikeText([]byte(in)); got != want {
			t.Errorf("LooksLikeText(%q) = %v, want %v", in, got, want)
		}
	}
}
