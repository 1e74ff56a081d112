package issuer

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	"github.com/latchkey/latchkey/attest/tpm/wire"
)

// Measure returns a wire.Policy describing the machine it runs on: the current
// SHA-256 values of pcrs (wire.DefaultPCRs when empty) and the hash of its EK,
// for `latchkey-agent measure` to print as a policy snippet an image
// builder pastes into the verifier's policy. It trusts the EK by hash; an
// operator whose TPMs carry EK certificates may swap that for ekCARoots.
func Measure(ctx context.Context, device string, pcrs []int) (*wire.Policy, error) {
	if len(pcrs) == 0 {
		pcrs = wire.DefaultPCRs
	}
	if err := wire.CheckPCRs(pcrs); err != nil {
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

func measure(c *tpmConn, pcrs []int) (*wire.Policy, error) {
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
	p := &wire.Policy{PCRs: make(map[int][]string, len(values)), EKPublicKeyHashes: []string{ekHash}}
	for idx, v := range values {
		p.PCRs[idx] = []string{hex.EncodeToString(v)}
	}
	return p, nil
}

// ekHashOf is the "sha256:<hex>" SPKI hash of an EK public area, as the
// validator computes it (ekPublicKeyHashes). The area comes from this
// machine's own TPM, so nothing here checks it: the verifier does when
// the EK is presented.
func ekHashOf(raw []byte) (string, error) {
	pub, err := tpm2.Unmarshal[tpm2.TPMTPublic](raw)
	if err != nil {
		return "", fmt.Errorf("ek public: %w", err)
	}
	params, err := pub.Parameters.RSADetail()
	if err != nil {
		return "", fmt.Errorf("ek parameters: %w", err)
	}
	n, err := pub.Unique.RSA()
	if err != nil {
		return "", fmt.Errorf("ek modulus: %w", err)
	}
	key, err := tpm2.RSAPub(params, n)
	if err != nil {
		return "", fmt.Errorf("ek key: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return "", fmt.Errorf("marshal ek: %w", err)
	}
	return atls.Pin(sha256.Sum256(der)).String(), nil
}

// digestName spells a digest as the policy document does.
func digestName(d [sha256.Size]byte) string { return "sha256:" + hex.EncodeToString(d[:]) }

// MeasureBoot is the component view of the machine it runs on: its event
// logs replayed against its current PCRs (bootlog.Verify), and the component
// policy that admits exactly it. It returns nils and no error when the
// machine has no firmware event log.
func MeasureBoot(ctx context.Context, device string, paths LogPaths) (*bootlog.Boot, *wire.BootPolicy, error) {
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
	b, err := bootlog.Verify(pcrs, l.fw, l.sd)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm measure: %w", err)
	}
	return b, componentPolicy(b, bootlog.UKIByLogOrder(l.fw)), nil
}

// componentPolicy is the component policy that admits exactly b: its
// boot loaders and UKI, its passed command line, its Secure Boot state and
// db, and its boot phase. uki is the index in b.Applications of the UKI
// (-1: none), which only the machine's own log order tells (bootlog.UKIByLogOrder);
// the verifier never reads that order. The UKI's built-in .cmdline is only
// known by digest, so with a passed command line an operator adds the
// UKI's text (`latchkey-verifier policy predict` prints it).
func componentPolicy(b *bootlog.Boot, uki int) *wire.BootPolicy {
	p := &wire.BootPolicy{}
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
