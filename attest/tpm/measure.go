package tpm

import (
	"context"
	"encoding/hex"
	"encoding/pem"
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

// MeasureBoot is the component view of the machine it runs on: its event
// logs replayed against its current PCRs (VerifyBoot). It returns nil and
// no error when the machine has no firmware event log.
func MeasureBoot(ctx context.Context, device string, paths LogPaths) (*Boot, error) {
	l, err := readLogs(paths.withDefaults())
	if err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	if len(l.fw) == 0 {
		return nil, nil
	}
	touched, err := touchedPCRs(l)
	if err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	c, err := open(device)
	if err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	stop := c.interruptible(ctx)
	values, err := readPCRs(c, slices.Sorted(slices.Values(touched)))
	stop()
	if cerr := c.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	pcrs := make(map[int][32]byte, len(values))
	for p, v := range values {
		pcrs[p] = [32]byte(v)
	}
	b, err := VerifyBoot(pcrs, l.fw, l.sd)
	if err != nil {
		return nil, fmt.Errorf("tpm measure: %w", err)
	}
	return b, nil
}

// ComponentPolicy is the component policy that admits exactly b: its boot
// loaders and UKI, its passed command line, its Secure Boot state and db,
// and its boot phase. The UKI's built-in .cmdline is only known by digest,
// so with a passed command line an operator adds the UKI's text
// (`latchkey-verifier policy predict` prints it).
func ComponentPolicy(b *Boot) *BootPolicy {
	p := &BootPolicy{}
	for _, a := range b.Applications {
		switch a.Role {
		case RoleBootLoader:
			p.BootLoaders = append(p.BootLoaders, digestName(a.Digest))
		case RoleUKI:
			p.UKIs = append(p.UKIs, digestName(a.Digest))
		}
	}
	if b.CmdlinePassed {
		p.KernelCmdlines = []string{b.Cmdline}
	}
	p.SecureBoot.AllowDisabled = !b.SecureBoot.Enabled
	if b.SecureBoot.Enabled {
		for _, c := range b.SecureBoot.DB {
			p.SecureBoot.DBCertificates = append(p.SecureBoot.DBCertificates, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})))
		}
	}
	if b.PhaseKnown {
		p.PCR11Phases = []string{b.Phase}
	}
	return p
}
