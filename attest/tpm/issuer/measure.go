package tpm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
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
// logs replayed against its current PCRs (VerifyBoot), and the component
// policy that admits exactly it. It returns nils and no error when the
// machine has no firmware event log.
func MeasureBoot(ctx context.Context, device string, paths LogPaths) (*Boot, *BootPolicy, error) {
	l, err := readLogs(paths.withDefaults())
	if err != nil {
		return nil, nil, fmt.Errorf("tpm measure: %w", err)
	}
	if len(l.fw) == 0 {
		return nil, nil, nil
	}
	touched, err := touchedPCRs(l)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm measure: %w", err)
	}
	c, err := open(device)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm measure: %w", err)
	}
	stop := c.interruptible(ctx)
	values, err := readPCRs(c, slices.Sorted(slices.Values(touched)))
	stop()
	if cerr := c.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tpm measure: %w", err)
	}
	pcrs := make(map[int][32]byte, len(values))
	for p, v := range values {
		pcrs[p] = [32]byte(v)
	}
	b, err := VerifyBoot(pcrs, l.fw, l.sd)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm measure: %w", err)
	}
	return b, componentPolicy(b, ukiByLogOrder(l.fw)), nil
}

// componentPolicy is the component policy that admits exactly b: its
// boot loaders and UKI, its passed command line, its Secure Boot state and
// db, and its boot phase. uki is the index in b.Applications of the UKI
// (-1: none), which only the machine's own log order tells (ukiByLogOrder);
// the verifier never reads that order. The UKI's built-in .cmdline is only
// known by digest, so with a passed command line an operator adds the
// UKI's text (`latchkey-verifier policy predict` prints it).
func componentPolicy(b *Boot, uki int) *BootPolicy {
	p := &BootPolicy{}
	for i, a := range b.Applications {
		switch {
		case i == uki:
			p.UKIs = append(p.UKIs, digestName(a.Digest))
		case uki < 0 || i < uki || a.Attempt != b.Applications[uki].Attempt:
			p.BootLoaders = append(p.BootLoaders, digestName(a.Digest))
		}
	}
	if b.CmdlinePassed {
		p.KernelCmdlines = []string{b.Cmdline}
	}
	for _, m := range b.Unexplained {
		p.ExtraMeasurements = append(p.ExtraMeasurements, digestName(m.Digest))
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

// ukiByLogOrder is the index in the PCR 4 applications of the last one
// the firmware log shows before systemd-stub's first PCR 11 measurement,
// or -1. The order of events across PCRs is not measured, so only the
// machine itself, reading its own log, may use it.
func ukiByLogOrder(fwLog []byte) int {
	el, err := tcg.ParseEventLog(fwLog, tcg.ParseOpts{})
	if err != nil {
		return -1
	}
	uki, n := -1, 0
	for _, e := range el.Events(register.HashSHA256) {
		if e.Type == tcg.NoAction || len(e.Digest) != sha256.Size {
			continue
		}
		if e.Index == pcrKernel {
			return uki
		}
		if e.Index != pcrBootApps {
			continue
		}
		switch [sha256.Size]byte(e.Digest) {
		case digestCallingApp, digestReturningApp, digestSeparator, digestSeparatorErr:
		default:
			uki = n
			n++
		}
	}
	return -1
}
