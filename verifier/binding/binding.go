// Package binding records which attested machine owns a disk UUID or a
// node name: a first-use registry. The first join that names a disk UUID
// or node name claims it for its machine identity (attest.Verified's
// MachineID); every later join naming it must come from the same identity,
// or the verifier refuses it with IDENTITY_MISMATCH. Only an operator
// releases a record (a node replaced, a TPM swapped, an SNP VM moved to
// another host).
//
// Three stores implement the Store interface: Leases (coordination.k8s.io
// Leases in a namespace of latchkey's own, shared by every verifier
// replica), Dir (one file per record in the verifier's state directory,
// for disk-only mode with one replica) and Etcd (etcd.go: an etcd cluster
// shared by several disk-only replicas). Each creates a record atomically
// only when it is absent, so two joins racing for one name never both
// win.
//
// A node record also carries the ID of the last bootstrap token minted
// for it; the CSR approver signs a kubelet client certificate only for a
// CSR made with that token. Continuous re-attestation keeps
// its results on the same node record.
package binding

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/latchkey/latchkey/protocol"
)

// Kind says what a record binds.
type Kind string

// Kinds of records.
const (
	Node Kind = "node"
	Disk Kind = "disk"
)

// Errors callers test with errors.Is.
var (
	// ErrMismatch: the record is bound to another identity. The error is
	// a *MismatchError naming both.
	ErrMismatch = errors.New("bound to another machine identity")
	// ErrNotFound: no record exists for the name.
	ErrNotFound = errors.New("no binding record")
	// ErrInvalid: the kind, name or identity cannot be recorded.
	ErrInvalid = errors.New("invalid binding")
)

// MismatchError is a claim or check refused because the record holds
// another identity.
type MismatchError struct {
	Kind     Kind
	Name     string
	Identity string // the identity that asked
	Bound    string // the identity on record
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s %s is bound to %s, not %s", e.Kind, e.Name, e.Bound, e.Identity)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Record is one binding.
type Record struct {
	Kind     Kind
	Name     string
	Identity string
	// TokenID is the last bootstrap token minted for a node ("" for a
	// disk, or a node never given a token).
	TokenID string
	// TokenRecorded and TokenExpiry are when TokenID was recorded and
	// when it expires (zero when unknown; Leases only).
	TokenRecorded, TokenExpiry time.Time
	// Created is when the record was claimed (or last taken over).
	Created time.Time
	// Released is when an operator released it (zero while bound); a
	// released record has no Identity and no TokenID, and the next Claim
	// takes it over.
	Released time.Time
	// ReleasedBy says who released it (the admin caller).
	ReleasedBy string
	// KeyGeneration is the master-secret generation a disk's last join
	// named (generation.go); nil for a node, and for a disk recorded
	// before generations were (its generation is unknown).
	KeyGeneration *uint32
}

// Bound reports whether the record holds an identity (it was not
// released).
func (r Record) Bound() bool { return r.Identity != "" }

// Store is a first-use registry of bindings. Implementations are safe for
// concurrent use.
type Store interface {
	// Claim binds name to identity when no record exists or the record
	// was released (atomically: of two racing claims exactly one wins),
	// and returns the record. A record bound to another identity is a
	// *MismatchError.
	Claim(ctx context.Context, kind Kind, name, identity string) (Record, error)
	// Get returns the record, or an error wrapping ErrNotFound.
	Get(ctx context.Context, kind Kind, name string) (Record, error)
	// SetToken records the bootstrap token minted for a node bound to
	// identity. It fails with a *MismatchError when the record now holds
	// another identity (released and reclaimed meanwhile) and with
	// ErrNotFound when it was released.
	SetToken(ctx context.Context, node, identity, tokenID string) error
	// Release unbinds the record (an operator's decision; by says who,
	// for the audit line), leaving a released record the next Claim takes
	// over, and returns what it held. Releasing a record that is not
	// bound is an error wrapping ErrNotFound.
	Release(ctx context.Context, kind Kind, name, by string) (Record, error)
	// List returns every record it can read. A record that cannot be
	// read is left out and named in a *SkippedError returned with the
	// rest (skipped.go); any other error means no listing.
	List(ctx context.Context) ([]Record, error)
}

// Check compares a bound record with the identity that asks; a released
// record matches nobody.
func Check(r Record, identity string) error {
	if r.Identity != identity {
		return &MismatchError{Kind: r.Kind, Name: r.Name, Identity: identity, Bound: r.Identity}
	}
	return nil
}

// MaxIdentityLen bounds an identity ("snp-chip:" + 128 hex + host data is
// the longest latchkey makes).
const MaxIdentityLen = 512

// validRecord checks a record read back from a store.
func validRecord(r Record) bool {
	if validate(r.Kind, r.Name, r.Identity, r.Released.IsZero()) != nil {
		return false
	}
	if r.KeyGeneration != nil && (r.Kind != Disk || *r.KeyGeneration > MaxGeneration) {
		return false
	}
	return r.Released.IsZero() || (r.Identity == "" && r.TokenID == "")
}

// validate checks what a store is asked to record.
func validate(kind Kind, name, identity string, needIdentity bool) error {
	switch kind {
	case Node:
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return fmt.Errorf("%w: node name %.64q is not a DNS-1123 subdomain", ErrInvalid, name)
		}
	case Disk:
		if !protocol.ValidDiskUUID(name) {
			return fmt.Errorf("%w: disk uuid %.64q is not a canonical lower-case uuid", ErrInvalid, name)
		}
	default:
		return fmt.Errorf("%w: kind %q", ErrInvalid, kind)
	}
	if needIdentity && (identity == "" || len(identity) > MaxIdentityLen || strings.ContainsAny(identity, "\n\r\x00")) {
		return fmt.Errorf("%w: identity %.64q", ErrInvalid, identity)
	}
	return nil
}

// ObjectName is the record's object name (Lease or file): "<kind>-<name>"
// when that fits a DNS-1123 subdomain (253 characters, and a file name's
// 255), else "<kind>-h-" and SHA-256 of the name in hex; the name itself
// is kept inside the record.
func ObjectName(kind Kind, name string) string {
	n := string(kind) + "-" + name
	if len(n) <= validation.DNS1123SubdomainMaxLength {
		return n
	}
	sum := sha256.Sum256([]byte(name))
	return string(kind) + "-h-" + hex.EncodeToString(sum[:])
}
