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

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/uefilog"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// DefaultPCR11Phases are the phases the agent unit runs in: after
// sysinit.target, before or after systemd-pcrphase.service's "ready", with
// a systemd initrd (which measures enter-initrd and leave-initrd) or
// another one (Debian's initramfs-tools measures nothing).
var DefaultPCR11Phases = []string{
	"enter-initrd:leave-initrd:sysinit", "enter-initrd:leave-initrd:sysinit:ready",
	"sysinit", "sysinit:ready",
}

// compiledBoot is a BootPolicy parsed once.
type compiledBoot struct {
	ukis, loaders  [][sha256.Size]byte
	cmdlines       []string
	cmdlineDigests [][sha256.Size]byte
	allowSBOff     bool
	db             [][]byte // DER
	signers        []pcrSigner
	phases         []string
	extra          [][sha256.Size]byte
}

func compileBoot(p *BootPolicy) (*compiledBoot, error) {
	if p == nil {
		return nil, nil
	}
	c := &compiledBoot{allowSBOff: p.SecureBoot.AllowDisabled, cmdlines: p.KernelCmdlines}
	var err error
	if c.ukis, err = parseDigests("boot.ukis", p.UKIs); err != nil {
		return nil, err
	}
	if c.loaders, err = parseDigests("boot.bootLoaders", p.BootLoaders); err != nil {
		return nil, err
	}
	if c.extra, err = parseDigests("boot.extraMeasurements", p.ExtraMeasurements); err != nil {
		return nil, err
	}
	for _, cl := range p.KernelCmdlines {
		for _, v := range []string{cl, cl + "\n", cl + "\x00"} {
			c.cmdlineDigests = append(c.cmdlineDigests, sha256.Sum256([]byte(v)))
		}
	}
	for i, s := range p.SecureBoot.DBCertificates {
		certs, err := parsePEMCerts([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("boot.secureBoot.dbCertificates[%d]: %w", i, err)
		}
		for _, cert := range certs {
			c.db = append(c.db, cert.Raw)
		}
	}
	for i, s := range p.PCR11Signers {
		sg, err := compileSigner(s)
		if err != nil {
			return nil, fmt.Errorf("boot.pcr11Signers[%d]: %w", i, err)
		}
		c.signers = append(c.signers, sg)
	}
	c.phases = p.PCR11Phases
	if len(c.phases) == 0 {
		c.phases = DefaultPCR11Phases
	}
	for i, ph := range c.phases {
		if ph != strings.TrimSpace(ph) || strings.Contains(ph, "::") || strings.HasPrefix(ph, ":") || strings.HasSuffix(ph, ":") {
			return nil, fmt.Errorf("boot.pcr11Phases[%d]: %q is not a ':'-separated list of phase words", i, ph)
		}
	}
	return c, nil
}

func parseDigests(field string, in []string) ([][sha256.Size]byte, error) {
	ds, err := uefilog.ParseDigests(field, "sha256", sha256.Size, in)
	if err != nil {
		return nil, err
	}
	out := make([][sha256.Size]byte, len(ds))
	for i, d := range ds {
		out[i] = [sha256.Size]byte(d)
	}
	return out, nil
}

// parsePEMPublicKey returns the DER of the one PUBLIC KEY block in s.
func parsePEMPublicKey(s string) ([]byte, error) {
	block, rest := pem.Decode([]byte(strings.TrimSpace(s)))
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("not a pem PUBLIC KEY")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("text after the PUBLIC KEY block")
	}
	return block.Bytes, nil
}

func digestName(d [sha256.Size]byte) string { return "sha256:" + hex.EncodeToString(d[:]) }

// check compares a verified state with the component policy. The checks,
// in order, each with its reason:
//
//  1. EVENT_LOG_MISMATCH: the evidence carried a firmware event log, and
//     every measurement in PCR 11 and 12 the verifier cannot read
//     (Boot.Unexplained) is in extraMeasurements.
//  2. SECURE_BOOT_REQUIRED: Secure Boot is on unless allowed off; when
//     on, every db certificate is in dbCertificates.
//  3. COMPONENT_NOT_ALLOWED: the boot applications fit the policy (see
//     placeApplications); a UKI was measured if ukis or pcr11Signers are
//     set; the UKI is in ukis or, failing that, pcr11Signers are set
//     (step 4 decides).
//  4. PCR_SIGNATURE_INVALID (UKI not in ukis): PCR 11 is in one of
//     pcr11Phases, and the signature JSON holds an entry whose policy
//     digest is PolicyPCRDigest of the quoted PCR 11, signed by a listed
//     key.
//  5. CMDLINE_NOT_ALLOWED: the measured command lines are admitted (see
//     BootPolicy.KernelCmdlines).
func (c *compiledBoot) check(st *State) error {
	b := st.Boot
	if b == nil {
		return mismatch("the policy checks boot components, the evidence carries no firmware event log")
	}
	for _, m := range b.Unexplained {
		if !slices.Contains(c.extra, m.Digest) {
			return mismatch("pcr %d: measurement %d (%s) is neither content-verified nor explained by the policy (boot.extraMeasurements)", m.PCR, m.Index, digestName(m.Digest))
		}
	}
	if err := c.checkSecureBoot(b); err != nil {
		return err
	}
	uki, ukiAdmitted, err := c.checkApplications(b)
	if err != nil {
		return err
	}
	if !ukiAdmitted {
		if err := c.checkPCR11Signature(st, uki); err != nil {
			return err
		}
	}
	return c.checkCmdline(b)
}

func (c *compiledBoot) checkSecureBoot(b *Boot) error {
	if !b.SecureBoot.Enabled {
		if c.allowSBOff {
			return nil
		}
		return attest.Refuse(latchkeyv1.Reason_SECURE_BOOT_REQUIRED, "secure boot is off (pcr 7), the policy requires it")
	}
	for _, cert := range b.SecureBoot.DB {
		if !slices.ContainsFunc(c.db, func(der []byte) bool { return bytes.Equal(der, cert.Raw) }) {
			return attest.Refuse(latchkeyv1.Reason_SECURE_BOOT_REQUIRED, "secure boot db certificate %q (%s) in pcr 7 is not allowed", cert.Subject.String(), certDigest(cert))
		}
	}
	return nil
}

func certDigest(c *x509.Certificate) string { return digestName(sha256.Sum256(c.Raw)) }

// checkApplications is step 3: uefilog's placement of the PCR 4
// applications (its doc comment says how the UKI is found). It returns
// the UKI and whether ukis admitted it.
func (c *compiledBoot) checkApplications(b *Boot) (Application, bool, error) {
	p := uefilog.Placement[[sha256.Size]byte]{
		UKIs: c.ukis, Loaders: c.loaders, Signers: len(c.signers) > 0,
		Where: "pcr 4", Sections: "pcr 11", Name: digestName,
	}
	return p.Place(b.Applications, len(b.UKISections) > 0)
}

// checkPCR11Signature is step 4.
func (c *compiledBoot) checkPCR11Signature(st *State, uki Application) error {
	b := st.Boot
	if !b.PhaseKnown || !slices.Contains(c.phases, b.Phase) {
		return attest.Refuse(latchkeyv1.Reason_PCR_SIGNATURE_INVALID, "uki %s: pcr 11 is in boot phase %q, the policy accepts %q", digestName(uki.Digest), b.Phase, c.phases)
	}
	pcr11 := st.PCRs[pcrKernel]
	pol := PolicyPCRDigest(pcr11)
	if len(st.PCR11Signatures) == 0 {
		return attest.Refuse(latchkeyv1.Reason_PCR_SIGNATURE_INVALID, "uki %s is not in ukis and the evidence carries no pcr 11 signature", digestName(uki.Digest))
	}
	var signedBy []string
	for _, s := range st.PCR11Signatures {
		if s.PolicyDigest != pol {
			continue
		}
		for _, sg := range c.signers {
			if sg.fp == s.KeyFingerprint && sg.verify(pol, s.Signature) {
				return nil
			}
		}
		signedBy = append(signedBy, digestName(s.KeyFingerprint))
	}
	if len(signedBy) == 0 {
		return attest.Refuse(latchkeyv1.Reason_PCR_SIGNATURE_INVALID, "pcr 11 value %s (phase %q) is not signed: no signature entry has its policy digest %s", hex.EncodeToString(pcr11[:]), b.Phase, hex.EncodeToString(pol[:]))
	}
	return attest.Refuse(latchkeyv1.Reason_PCR_SIGNATURE_INVALID, "pcr 11 value %s (phase %q) is signed only by keys %v, none a valid signature of a pcr11Signer", hex.EncodeToString(pcr11[:]), b.Phase, signedBy)
}

// checkCmdline is step 5.
func (c *compiledBoot) checkCmdline(b *Boot) error {
	if b.CmdlinePassed && !slices.Contains(c.cmdlines, b.Cmdline) {
		return attest.Refuse(latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "kernel command line %q in pcr 12 is not allowed", b.Cmdline)
	}
	if s, ok := b.Section(".cmdline"); ok && len(c.cmdlines) > 0 && !slices.Contains(c.cmdlineDigests, s.Digest) {
		return attest.Refuse(latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "uki .cmdline %s in pcr 11 is not an allowed kernel command line", digestName(s.Digest))
	}
	return nil
}
