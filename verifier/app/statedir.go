package app

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// checkStateDir makes sure the state directory exists and is writable
// when the verifier keeps anything there (the self-managed serving key,
// disk-only binding records). A directory it cannot write is the
// operator's to fix: a configuration error naming stateDir, not a
// restart every few seconds with an error about a file inside it.
func (v *Verifier) checkStateDir() error {
	usesState := v.cfg.TLSCert == "" ||
		(v.deps.Bindings == nil && v.cfg.Kubernetes == nil && v.cfg.Identity.BindingDir == "")
	if !usesState {
		return nil
	}
	dir := v.cfg.StateDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("stateDir %s cannot be created: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("stateDir %s is not writable: %w", dir, err)
	}
	name := f.Name()
	return errors.Join(wrapState(dir, f.Close()), wrapState(dir, os.Remove(name)))
}

func wrapState(dir string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("stateDir %s is not writable: %w", filepath.Clean(dir), err)
}
