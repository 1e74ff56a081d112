package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// onlyFile fails unless dir holds exactly name: no temporary file is
// left behind.
func onlyFile(t *testing.T, dir, name string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Name() != name {
		t.Fatalf("directory holds %v, want only %s", es, name)
	}
}

func TestWriteReplacesWithMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	for _, data := range []string{"first", "second, longer"} {
		if err := Write(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != data {
			t.Fatalf("read %q %v, want %q", got, err, data)
		}
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v, want 0600", st.Mode(), err)
	}
	if err := Write(p, []byte("public"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, want 0644", st.Mode())
	}
	onlyFile(t, dir, "key")
}

func TestCreateNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "record")
	if err := Create(p, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(p, []byte("theirs"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create: %v, want fs.ErrExist", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "mine" {
		t.Fatalf("content %q after a refused create", got)
	}
	onlyFile(t, dir, "record")
}

func TestWriteIntoMissingDirectoryFails(t *testing.T) {
	p := filepath.Join(t.TempDir(), "absent", "file")
	if err := Write(p, []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err %v, want fs.ErrNotExist", err)
	}
}
