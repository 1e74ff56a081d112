package keys

import (
	"bytes"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// keyIDInfo is the HKDF info of the key ID, a value no disk UUID can
// produce, so the ID reveals nothing about any disk key.
const keyIDInfo = "latchkey/v1 key id"

// keyIDSize is how many bytes of the derivation the key ID shows: enough
// to tell secrets apart, far too few to matter to an attacker (the master
// secret is 256 bits or more and the HKDF output is one-way).
const keyIDSize = 8

// ErrSecretExists is returned by InitMasterSecret for a path that exists.
var ErrSecretExists = errors.New("master secret file already exists")

// InitMasterSecret creates a new master secret at path: MinMasterSecretSize
// random bytes, mode 0600, created exclusively so an existing secret (and
// with it every disk key) is never overwritten.
func InitMasterSecret(path string) error {
	b := make([]byte, MinMasterSecretSize)
	defer clear(b)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("random master secret: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s: %w; it is never overwritten (every disk key depends on it)", path, ErrSecretExists)
	}
	if err != nil {
		return fmt.Errorf("create master secret: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path) // created by this call, holds a partial secret
		return fmt.Errorf("write master secret: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("sync master secret: %w", err)
	}
	return f.Close()
}

// KeyID is a non-secret name of the current generation's master secret
// and the cluster salt ("kid-" and 16 hex digits). Replicas that print
// the same ID derive the same disk keys; a secret copied with a stray
// newline, or another cluster's salt, shows another ID.
func (d *Deriver) KeyID() string { return d.gens[d.current].keyID(d.salt) }

func (g *generation) keyID(salt []byte) string {
	id, err := hkdf.Key(sha256.New, g.master, salt, keyIDInfo, keyIDSize)
	if err != nil { // only for lengths hkdf cannot produce; keyIDSize is fixed
		panic(err)
	}
	return "kid-" + hex.EncodeToString(id)
}

// checkSecretFile refuses a master-secret file that anyone but its owner
// can read: the secret opens every disk of the cluster.
func checkSecretFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("read master secret: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("master secret %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("master secret %s is readable or writable by group or others (mode %04o): run `chmod 0600 %s`", path, perm, path)
	}
	return nil
}

// LooksLikeText reports whether a secret is printable text ending in a
// newline, the mark of a secret typed or pasted into an editor. The
// newline is part of the secret (the bytes are used raw, and changing
// them would change every disk key), so the verifier only warns.
func LooksLikeText(secret []byte) bool {
	if len(secret) == 0 || secret[len(secret)-1] != '\n' {
		return false
	}
	body := bytes.TrimRight(secret, "\r\n")
	for _, c := range body {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
