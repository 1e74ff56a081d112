package tpm

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/latchkey/latchkey/attest/atls"
)

// compiledPolicy is a Policy parsed once so validation does no parsing.
type compiledPolicy struct {
	pcrs     map[int][][sha256.Size]byte
	pcrOrder []int // ascending, so refusals name the lowest failing PCR
	roots    *x509.CertPool
	ekHashes []atls.Pin
	akHashes []atls.Pin
	boot     *compiledBoot // nil: no component policy
}

func compile(p Policy) (*compiledPolicy, error) {
	c := &compiledPolicy{pcrs: make(map[int][][sha256.Size]byte, len(p.PCRs))}
	for idx, values := range p.PCRs {
		digests, err := compilePCR(idx, values)
		if err != nil {
			return nil, err
		}
		c.pcrs[idx] = digests
		c.pcrOrder = append(c.pcrOrder, idx)
	}
	slices.Sort(c.pcrOrder)
	var err error
	if c.roots, err = compileRoots(p.EKCARoots); err != nil {
		return nil, err
	}
	if c.ekHashes, err = atls.ParsePins(p.EKPublicKeyHashes); err != nil {
		return nil, fmt.Errorf("ekPublicKeyHashes: %w", err)
	}
	if c.akHashes, err = atls.ParsePins(p.AKPublicKeyHashes); err != nil {
		return nil, fmt.Errorf("akPublicKeyHashes: %w", err)
	}
	if c.boot, err = compileBoot(p.Boot); err != nil {
		return nil, err
	}
	return c, nil
}

func compilePCR(idx int, values []string) ([][sha256.Size]byte, error) {
	if idx < 0 || idx > maxPCR {
		return nil, fmt.Errorf("pcrs: index %d out of range 0..%d", idx, maxPCR)
	}
	if len(values) == 0 {
		return nil, fmt.Errorf("pcrs[%d]: empty list (drop the entry to leave the pcr unchecked)", idx)
	}
	digests := make([][sha256.Size]byte, 0, len(values))
	for _, v := range values {
		raw, err := hex.DecodeString(strings.TrimSpace(v))
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("pcrs[%d]: %q is not a sha-256 digest (64 hex digits)", idx, v)
		}
		digests = append(digests, [sha256.Size]byte(raw))
	}
	return digests, nil
}

// compileRoots parses the EK CA anchors; nil when there are none, so the
// certificate path is skipped rather than tried against an empty pool.
func compileRoots(pems []string) (*x509.CertPool, error) {
	if len(pems) == 0 {
		return nil, nil
	}
	pool := x509.NewCertPool()
	for i, s := range pems {
		certs, err := parsePEMCerts([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("ekCARoots[%d]: %w", i, err)
		}
		for _, c := range certs {
			pool.AddCert(c)
		}
	}
	return pool, nil
}

// parsePEMCerts parses one or more CERTIFICATE blocks and refuses other
// block types and text after the last block. Text before a block (the
// subject lines openssl prints) is skipped, as pem.Decode does.
func parsePEMCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := bytes.TrimSpace(data)
	for len(rest) > 0 {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("not a pem certificate")
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("pem block %q is not a CERTIFICATE", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		certs = append(certs, c)
		rest = bytes.TrimSpace(rest)
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificate")
	}
	return certs, nil
}

func (c *compiledPolicy) hasAnchors() bool {
	return c.roots != nil || len(c.ekHashes) > 0 || len(c.akHashes) > 0
}

// pinned reports whether p is in pins. Key hashes are public, so this
// needs no constant time; Pin.Equal happens to give it anyway.
func pinned(pins []atls.Pin, p atls.Pin) bool {
	return slices.ContainsFunc(pins, p.Equal)
}
