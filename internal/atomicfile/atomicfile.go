// Package atomicfile writes a file so that a reader, or the next start
// after a crash, sees either the old content or the whole new content,
// never a truncated file: the data goes to a temporary file in the same
// directory (created with the final mode, so a secret is never readable
// by others, not even briefly), is synced, and is then renamed or linked
// into place, and the directory is synced so the name survives a crash.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, mode mode.
func Write(path string, data []byte, mode fs.FileMode) error {
	return place(path, data, mode, os.Rename, "write")
}

// Create writes data to path, mode mode, only if path does not exist:
// an error wrapping fs.ErrExist otherwise, and path is left as it was.
func Create(path string, data []byte, mode fs.FileMode) error {
	return place(path, data, mode, os.Link, "create")
}

// place writes data to a temporary file and moves it to path with
// move (rename replaces, link never does), then syncs the directory.
func place(path string, data []byte, mode fs.FileMode, move func(tmp, path string) error, op string) error {
	tmp, err := writeTemp(path, data, mode)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := move(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			err = fs.ErrExist
		}
		return fmt.Errorf("%s %s: %w", op, path, err)
	}
	return syncDir(filepath.Dir(path))
}

// writeTemp writes data to a new temporary file beside path and returns
// its name; the caller removes it.
func writeTemp(path string, data []byte, mode fs.FileMode) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	werr := f.Chmod(mode)
	if werr == nil {
		_, werr = f.Write(data)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write %s: %w", path, werr)
	}
	return f.Name(), nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
