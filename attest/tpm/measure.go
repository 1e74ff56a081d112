package tpm

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
)

// Measure returns a Policy describing the machine it runs on: the current
// SHA-256 values of pcrs (DefaultPCRs when empty) and the hash of its EK,
// for `latchkey-agent measure` to print as a policy snippet an image
// builder pastes into the verifier's policy. It trusts the EK by hash; an
// operator whose TPMs carry EK certificates may swap that for ekCARoots.
func Measure(ctx context.Context, device string, pcrs []int) (*Policy, error) {
	if len(pcrs) == 0 {
		pcrs = DefaultPCRs
	}
	if err := checkPCRs(pcrs); err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	c, err := open(device)
	if err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	stop := c.interruptible(ctx)
	p, err := measure(c, slices.Sorted(slices.Values(pcrs)))
	stop()
	if cerr := c.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	return p, nil
}

func measure(c *tpmConn, pcrs []int) (*Policy, error) {
	values, err := readPCRs(c, pcrs)
	if err != nil {
		return nil, err
	}
	ek, err := loadEK(c)
	if err != nil {
		return nil, err
	}
	ekHash, err := ekHashOf(ek.public)
	if err = errors.Join(err, flush(c, ek)); err != nil {
		return nil, err
	}
	p := &Policy{PCRs: make(map[int][]string, len(values)), EKPublicKeyHashes: []string{ekHash}}
	for idx, v := range values {
		p.PCRs[idx] = []string{hex.EncodeToString(v)}
	}
	return p, nil
}

// ekHashOf is the "sha256:<hex>" SPKI hash of an EK public area, as
// trustEK computes it.
func ekHashOf(raw []byte) (string, error) {
	pub, err := parseCanonical[tpm2.TPMTPublic](raw, "ek public")
	if err != nil {
		return "", err
	}
	key, err := ekKey(pub)
	if err != nil {
		return "", err
	}
	h, err := keyHash(key)
	if err != nil {
		return "", err
	}
	return h.String(), nil
}
