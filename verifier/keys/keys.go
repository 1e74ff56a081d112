// Package keys derives every node's disk key from the cluster's master
// secret, so any verifier replica gives the same key to the same disk and a
// rebooting node gets its key back with no database:
//
//	disk key = HKDF-SHA256(master secret, salt = cluster salt,
//	                       info = "latchkey/v1 disk " + disk UUID)
//
// The master secret never leaves the verifier and is never logged.
package keys

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/latchkey/latchkey/protocol"
)

// MinMasterSecretSize is the shortest master secret accepted (256 bits).
const MinMasterSecretSize = 32

// MaxMasterSecretSize bounds what is read from a master-secret file.
const MaxMasterSecretSize = 4096

// CredentialName is the systemd credential (LoadCredential=) that holds the
// master secret when no file is configured.
const CredentialName = "latchkey-master-secret"

const diskInfoPrefix = "latchkey/v1 disk "

// Deriver derives disk keys from one or more master-secret generations
// (generations.go), one of them current. It holds copies of the secrets;
// call Close to clear them.
type Deriver struct {
	gens    []generation // sorted by number, unique
	current int          // index into gens
	salt    []byte
}

// generation is one numbered master secret.
type generation struct {
	n      uint32
	master []byte
	text   bool
}

// NewDeriver copies master and salt: one generation, 0, current. The salt
// is the cluster's public, per-cluster value, so two clusters sharing a
// master secret by mistake still hand out different keys.
func NewDeriver(master, salt []byte) (*Deriver, error) {
	return NewGenerations([]Secret{{Generation: 0, Bytes: master}}, 0, salt)
}

// SecretLooksLikeText reports whether any generation's master secret is
// printable text ending in a newline (see LooksLikeText), for a warning
// at start.
func (d *Deriver) SecretLooksLikeText() bool {
	for _, g := range d.gens {
		if g.text {
			return true
		}
	}
	return false
}

// DiskKey returns the key of the disk with this canonical UUID under the
// current generation.
func (d *Deriver) DiskKey(diskUUID string) ([]byte, error) {
	return d.gens[d.current].diskKey(d.salt, diskUUID)
}

func (g *generation) diskKey(salt []byte, diskUUID string) ([]byte, error) {
	if !protocol.ValidDiskUUID(diskUUID) {
		return nil, fmt.Errorf("disk uuid %q is not a canonical lower-case uuid", diskUUID)
	}
	return hkdf.Key(sha256.New, g.master, salt, diskInfoPrefix+diskUUID, protocol.DiskKeySize)
}

// Close clears every master secret held by d.
func (d *Deriver) Close() {
	for _, g := range d.gens {
		clear(g.master)
	}
}

// LoadMasterSecret reads the master secret from path, or, when path is
// empty, from the systemd credential directory ($CREDENTIALS_DIRECTORY).
// Surrounding whitespace is kept: the secret is raw bytes, not text. A
// file readable by group or others, or shorter than MinMasterSecretSize,
// is refused with the command that fixes it.
func LoadMasterSecret(path string) ([]byte, error) {
	if path == "" {
		dir := os.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return nil, errors.New("no master secret file configured and $CREDENTIALS_DIRECTORY is not set " +
				"(set masterSecretFile:, or create one with `latchkey-verifier secret init FILE`)")
		}
		path = filepath.Join(dir, CredentialName)
	}
	if err := checkSecretFile(path); err != nil {
		return nil, err
	}
	b, err := readBounded(path, MaxMasterSecretSize)
	if err != nil {
		return nil, fmt.Errorf("read master secret: %w", err)
	}
	if len(b) < MinMasterSecretSize {
		clear(b)
		return nil, fmt.Errorf("master secret %s is %d bytes, want at least %d (a new cluster makes one with `latchkey-verifier secret init FILE`)",
			path, len(b), MinMasterSecretSize)
	}
	return b, nil
}

func readBounded(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, limit+1)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		clear(buf)
		return nil, err
	}
	if n > limit {
		clear(buf)
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return buf[:n], nil
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// GenerationCredentialName is the systemd credential of generation n when
// masterSecrets names no file for it ("latchkey-master-secret.<n>").
func GenerationCredentialName(n uint32) string { return fmt.Sprintf("%s.%d", CredentialName, n) }

// LoadGenerationSecret reads generation n's master secret from path, or,
// when path is empty, from the systemd credential
// GenerationCredentialName(n), with every check of LoadMasterSecret.
func LoadGenerationSecret(n uint32, path string) ([]byte, error) {
	if path == "" {
		dir := os.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return nil, fmt.Errorf("masterSecrets generation %d names no file and $CREDENTIALS_DIRECTORY is not set "+
				"(set file:, or load the credential %s)", n, GenerationCredentialName(n))
		}
		path = filepath.Join(dir, GenerationCredentialName(n))
	}
	b, err := LoadMasterSecret(path)
	if err != nil {
		return nil, fmt.Errorf("generation %d: %w", n, err)
	}
	return b, nil
}
