// Package policy reads the verifier's reference policy, a strict,
// versioned YAML file, and compiles it into a Snapshot: one validator per
// enabled evidence variant. Unknown fields are refused, every reference
// value is a list (so an image upgrade lists old and new values together),
// and a variant without a section is not accepted at all.
//
//	apiVersion: latchkey/v1
//	tpm:
//	  allowControlPlane: false
//	  pcrs: {"7": ["<sha256 hex>", ...], ...}
//	  ekCARoots: ["-----BEGIN CERTIFICATE-----..."]
//	  boot:                      # the component policy (tpm.BootPolicy)
//	    ukis: ["sha256:<authenticode hex>"]
//	    pcr11Signers: ["-----BEGIN PUBLIC KEY-----..."]
//	  offlineUnlock: {maxBoots: 3, maxHours: 72}   # off when absent (offline.go)
//	snp:
//	  measurements: ["<hex>", ...]
//	  ...
//	deny:                        # revoked machines, names, disks (Deny)
//	  nodeNames: ["worker-7"]
//
// The Store keeps the snapshot in force and reloads the file when its
// content changes; a bad new file is refused with a log line and the old
// policy stays in force.
package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/latchkey/latchkey/internal/strictyaml"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/tpm"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// APIVersion is the only policy version this verifier reads.
const APIVersion = "latchkey/v1"

// MaxFileSize bounds a policy file.
const MaxFileSize = 1 << 20

// Policy is the parsed policy file.
type Policy struct {
	APIVersion string      `json:"apiVersion"`
	TPM        *TPMSection `json:"tpm,omitempty"`
	SNP        *SNPSection `json:"snp,omitempty"`
	// Deny revokes machines, node names and disks (deny.go).
	Deny *Deny `json:"deny,omitempty"`
}

// TPMSection enables TPM evidence with these reference values.
type TPMSection struct {
	tpm.Policy
	// AllowControlPlane lets TPM evidence join as control plane.
	AllowControlPlane bool `json:"allowControlPlane,omitempty"`
	// OfflineUnlock allows offline grants (offline.go); nil is off.
	OfflineUnlock *OfflineUnlock `json:"offlineUnlock,omitempty"`
}

// SNPSection enables SEV-SNP evidence with these reference values.
type SNPSection struct {
	snp.Policy
	// AllowControlPlane lets SNP evidence join as control plane.
	AllowControlPlane bool `json:"allowControlPlane,omitempty"`
	// OfflineUnlock is parsed only to be refused with the reason
	// (errSNPOffline) instead of as an unknown field.
	OfflineUnlock *OfflineUnlock `json:"offlineUnlock,omitempty"`
}

// Snapshot is a compiled policy: what one join is checked against.
type Snapshot struct {
	// Digest identifies the policy file content ("sha256:<hex>").
	Digest       string
	Validators   map[latchkeyv1.Variant]attest.Validator
	ControlPlane map[latchkeyv1.Variant]bool
	// Deny is the compiled deny list; nil denies nothing.
	Deny *DenyList
	// Offline holds the offlineUnlock bounds of each variant that allows
	// offline unlock (offline.go); a variant absent from it allows none.
	Offline map[latchkeyv1.Variant]OfflineUnlock
}

// Source returns the snapshot in force.
type Source interface {
	Current() *Snapshot
}

// Parse decodes a policy strictly: unknown, duplicate and case-variant
// fields, a wrong apiVersion or no enabled variant are errors.
func Parse(data []byte) (*Policy, error) {
	var p Policy
	if err := strictyaml.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("parse policy: %w", err)
	}
	if p.APIVersion != APIVersion {
		return nil, fmt.Errorf("policy apiVersion %q: want %q", p.APIVersion, APIVersion)
	}
	if p.TPM == nil && p.SNP == nil {
		return nil, errors.New("policy enables no evidence variant (add a tpm or snp section)")
	}
	return &p, nil
}

// Deps are what compiling needs besides the policy itself.
type Deps struct {
	// SNPCollateral supplies VCEKs not carried in reports; shared across
	// reloads so its caches survive them.
	SNPCollateral *snp.Collateral
}

// Compile builds the validators of every enabled variant.
func Compile(p *Policy, digest string, deps Deps) (*Snapshot, error) {
	s := &Snapshot{
		Digest:       digest,
		Validators:   map[latchkeyv1.Variant]attest.Validator{},
		ControlPlane: map[latchkeyv1.Variant]bool{},
	}
	var err error
	if s.Deny, err = compileDeny(p.Deny); err != nil {
		return nil, err // already names the deny key
	}
	if err := compileOffline(p, s); err != nil {
		return nil, err // already names the offlineUnlock key
	}
	if p.TPM != nil {
		v, err := tpm.NewValidator(p.TPM.Policy)
		if err != nil {
			return nil, err // already names the tpm policy
		}
		s.Validators[latchkeyv1.Variant_VARIANT_TPM] = v
		s.ControlPlane[latchkeyv1.Variant_VARIANT_TPM] = p.TPM.AllowControlPlane
	}
	if p.SNP != nil {
		v, err := snp.NewValidator(p.SNP.Policy, deps.SNPCollateral)
		if err != nil {
			return nil, err // already names the snp policy
		}
		s.Validators[latchkeyv1.Variant_VARIANT_SNP] = v
		s.ControlPlane[latchkeyv1.Variant_VARIANT_SNP] = p.SNP.AllowControlPlane
	}
	return s, nil
}

// Load parses and compiles data.
func Load(data []byte, deps Deps) (*Snapshot, error) {
	p, err := Parse(data)
	if err != nil {
		return nil, err
	}
	return Compile(p, Digest(data), deps)
}

// LoadFile reads, parses and compiles the file at path. It is also what
// `latchkey-verifier policy check` runs.
func LoadFile(path string, deps Deps) (*Snapshot, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Load(data, deps)
}

// ReadFile reads a policy file, refusing one over MaxFileSize.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read policy %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("policy %s is larger than %d bytes", path, MaxFileSize)
	}
	return data, nil
}

// Digest names policy content in logs and metrics.
func Digest(data []byte) string {
	sum := sha256.Sum256(bytes.TrimSpace(data))
	return "sha256:" + hex.EncodeToString(sum[:])
}
