package keys

import (
	"errors"
	"fmt"
	"slices"
)

// Master-secret generations make rotation possible without re-provisioning
// every node (docs/operations.md, "Rotating the master secret"). Each
// generation keeps the same derivation with its own secret:
//
//	disk key(n) = HKDF-SHA256(secret_n, salt = cluster salt,
//	                          info = "latchkey/v1 disk " + disk UUID)
//
// Exactly one generation is current: every ticket's disk_key is derived
// from it, and an agent whose disk header names an older generation the
// verifier still serves also gets that generation's key, unlocks with it
// and rewraps its keyslot to the current one. A generation the verifier
// no longer serves can open nothing, so a Hello naming it is refused
// rather than answered with a key that cannot open the disk.

// MaxGeneration bounds generation numbers (the disk header's subsystem
// field holds "latchkey-g<n>" in 48 bytes; this keeps numbers readable).
const MaxGeneration = 1<<31 - 1

// Secret is one generation's master secret, as loaded.
type Secret struct {
	Generation uint32
	Bytes      []byte
}

// GenerationInfo describes one served generation, for logs and metrics.
// Nothing in it is secret.
type GenerationInfo struct {
	Generation uint32
	KeyID      string
	Current    bool
	// LooksLikeText: the secret is printable text ending in a newline.
	LooksLikeText bool
}

// ErrRetired is returned for a generation the deriver does not serve.
var ErrRetired = errors.New("master-secret generation not served")

// NewGenerations copies every secret and the salt. The checks: at least
// one secret, generation numbers unique and at most MaxGeneration, every
// secret at least MinMasterSecretSize bytes, current among them, a
// non-empty salt. Two generations holding the same bytes are refused too:
// a "rotation" that copied the old file protects nothing.
func NewGenerations(secrets []Secret, current uint32, salt []byte) (*Deriver, error) {
	if len(secrets) == 0 {
		return nil, errors.New("no master secret")
	}
	if len(salt) == 0 {
		return nil, errors.New("cluster salt is empty")
	}
	d := &Deriver{salt: clone(salt), current: -1}
	for _, s := range secrets {
		if s.Generation > MaxGeneration {
			return nil, fmt.Errorf("master-secret generation %d is over %d", s.Generation, MaxGeneration)
		}
		if len(s.Bytes) < MinMasterSecretSize {
			return nil, fmt.Errorf("master secret of generation %d is %d bytes, want at least %d", s.Generation, len(s.Bytes), MinMasterSecretSize)
		}
		for _, g := range d.gens {
			if g.n == s.Generation {
				d.Close()
				return nil, fmt.Errorf("master-secret generation %d is listed twice", s.Generation)
			}
			if string(g.master) == string(s.Bytes) {
				d.Close()
				return nil, fmt.Errorf("master-secret generations %d and %d hold the same secret", g.n, s.Generation)
			}
		}
		d.gens = append(d.gens, generation{n: s.Generation, master: clone(s.Bytes), text: LooksLikeText(s.Bytes)})
	}
	slices.SortFunc(d.gens, func(a, b generation) int { return int(a.n) - int(b.n) })
	for i, g := range d.gens {
		if g.n == current {
			d.current = i
		}
	}
	if d.current < 0 {
		d.Close()
		return nil, fmt.Errorf("current master-secret generation %d is not among the secrets", current)
	}
	return d, nil
}

// Current is the generation every ticket's disk_key is derived from.
func (d *Deriver) Current() uint32 { return d.gens[d.current].n }

// Serves reports whether generation n is one the deriver has a secret for.
func (d *Deriver) Serves(n uint32) bool { return d.find(n) != nil }

// DiskKeyAt returns the disk's key under generation n, or an error
// wrapping ErrRetired when n is not served.
func (d *Deriver) DiskKeyAt(n uint32, diskUUID string) ([]byte, error) {
	g := d.find(n)
	if g == nil {
		return nil, fmt.Errorf("%w: generation %d", ErrRetired, n)
	}
	return g.diskKey(d.salt, diskUUID)
}

// KeyIDAt is KeyID for generation n ("" when n is not served).
func (d *Deriver) KeyIDAt(n uint32) string {
	g := d.find(n)
	if g == nil {
		return ""
	}
	return g.keyID(d.salt)
}

// Generations lists the served generations in ascending order.
func (d *Deriver) Generations() []GenerationInfo {
	out := make([]GenerationInfo, len(d.gens))
	for i := range d.gens {
		g := &d.gens[i]
		out[i] = GenerationInfo{Generation: g.n, KeyID: g.keyID(d.salt), Current: i == d.current, LooksLikeText: g.text}
	}
	return out
}

func (d *Deriver) find(n uint32) *generation {
	for i := range d.gens {
		if d.gens[i].n == n {
			return &d.gens[i]
		}
	}
	return nil
}
