package servingcert

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadOrCreateCreatesOnceWithMode0600(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	c1, err := LoadOrCreate(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{KeyFile, CertFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600", f, st.Mode().Perm())
		}
	}
	c2, err := LoadOrCreate(dir, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := Pins(c1)
	p2, _ := Pins(c2)
	if len(p1) != 1 || p1[0] != p2[0] {
		t.Fatalf("pin changed across restart: %v vs %v", p1, p2)
	}
}

func TestLoadOrCreateRefusesKeyWithoutCert(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadOrCreate(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, CertFile))
	_, err := LoadOrCreate(dir, time.Now())
	if err == nil || !strings.Contains(err.Error(), "refusing to replace a key") {
		t.Fatalf("err = %v, want refusal to replace the key", err)
	}
}
