package tdx

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/uefilog"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// BootPolicy is the component policy over the replayed CC event log (the
// tdx section's boot), the TDX form of the TPM policy's boot section:
// digests are SHA-384, as the RTMRs. Setting it requires the agent to
// send the CC event log. Kernel command lines are the tdx section's
// kernelCmdlines. Example:
//
//	boot:
//	  ukis: ["sha384:<96 hex digits>"]
//	  secureBoot: {dbCertificates: ["-----BEGIN CERTIFICATE-----…"]}
type BootPolicy struct {
	// UKIs are "sha384:<hex>" Authenticode digests of accepted UKIs (the
	// RTMR[1] application systemd-stub ran from).
	UKIs []string `json:"ukis,omitempty"`
	// BootLoaders are "sha384:<hex>" Authenticode digests of accepted
	// applications loaded before the UKI (systemd-boot, shim), or of every
	// application when no systemd-stub runs.
	BootLoaders []string `json:"bootLoaders,omitempty"`
	// SecureBoot is what RTMR[0] must show.
	SecureBoot SecureBootPolicy `json:"secureBoot,omitempty"`
	// ExtraMeasurements are "sha384:<hex>" digests of RTMR[2]
	// measurements the verifier cannot read (a boot loader's, the
	// kernel's initrd measurement, systemd-stub's credentials and
	// add-ons) accepted by digest. Empty: any such measurement refuses.
	ExtraMeasurements []string `json:"extraMeasurements,omitempty"`
	// JudgedRTMRs lists the RTMRs (1, 2 or both) this component policy
	// judges instead of reference values, so an upgrade is accepted by
	// listing the new UKI's digest rather than new register values. A
	// judged RTMR must not be listed in the tdx section's rtmrs; the CC
	// event log must replay to it, and every event in it must be
	// explained by this policy and kernelCmdlines. Judging RTMR[1] needs
	// ukis or bootLoaders, judging RTMR[2] needs ukis or kernelCmdlines.
	// Empty (the default): every RTMR is judged by its listed values
	// (all zeros when none are listed).
	JudgedRTMRs []int `json:"judgedRTMRs,omitempty"`
}

// SecureBootPolicy is the Secure Boot part of BootPolicy.
type SecureBootPolicy struct {
	// AllowDisabled admits TDs with Secure Boot off. The zero value
	// requires it on.
	AllowDisabled bool `json:"allowDisabled,omitempty"`
	// DBCertificates are PEM certificates accepted in the Secure Boot db:
	// with Secure Boot on, every db certificate must be listed.
	DBCertificates []string `json:"dbCertificates,omitempty"`
}

// compiledBoot is a BootPolicy parsed once.
type compiledBoot struct {
	ukis, loaders, extra []digest384
	allowSBOff           bool
	db                   [][]byte // DER
	// judged marks the RTMRs judged by components (JudgedRTMRs).
	judged [numRTMRs]bool
}

// compileJudged checks JudgedRTMRs against the rest of the policy: only
// RTMR[1] and RTMR[2], each once, none also listed with values, and
// neither left accept-all (a judged register needs a list that names
// what may be in it).
func (c *compiledBoot) compileJudged(p *Policy) error {
	for i, r := range p.Boot.JudgedRTMRs {
		if r != rtmrBoot && r != rtmrKernel {
			return fmt.Errorf("boot.judgedRTMRs[%d]: RTMR[%d] cannot be judged by components (only 1 and 2)", i, r)
		}
		if c.judged[r] {
			return fmt.Errorf("boot.judgedRTMRs[%d]: RTMR[%d] listed twice", i, r)
		}
		c.judged[r] = true
		if r < len(p.RTMRs) && len(p.RTMRs[r]) > 0 {
			return fmt.Errorf("rtmrs[%d]: RTMR[%d] is judged by boot components (boot.judgedRTMRs); list values or judge it, not both", r, r)
		}
	}
	if c.judged[rtmrBoot] && len(c.ukis) == 0 && len(c.loaders) == 0 {
		return errors.New("boot.judgedRTMRs: judging RTMR[1] needs boot.ukis or boot.bootLoaders")
	}
	if c.judged[rtmrKernel] && len(c.ukis) == 0 && len(p.KernelCmdlines) == 0 {
		return errors.New("boot.judgedRTMRs: judging RTMR[2] needs boot.ukis or kernelCmdlines")
	}
	return nil
}

func compileBoot(p *BootPolicy) (*compiledBoot, error) {
	if p == nil {
		return nil, nil
	}
	c := &compiledBoot{allowSBOff: p.SecureBoot.AllowDisabled}
	for _, l := range []struct {
		dst   *[]digest384
		src   []string
		field string
	}{{&c.ukis, p.UKIs, "boot.ukis"}, {&c.loaders, p.BootLoaders, "boot.bootLoaders"}, {&c.extra, p.ExtraMeasurements, "boot.extraMeasurements"}} {
		ds, err := uefilog.ParseDigests(l.field, "sha384", sha512.Size384, l.src)
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			*l.dst = append(*l.dst, digest384(d))
		}
	}
	for i, s := range p.SecureBoot.DBCertificates {
		rest := []byte(s)
		n := 0
		for {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				break
			}
			cert, err := x509.ParseCertificate(blk.Bytes)
			if blk.Type != "CERTIFICATE" || err != nil {
				return nil, fmt.Errorf("boot.secureBoot.dbCertificates[%d]: not a PEM certificate", i)
			}
			c.db = append(c.db, cert.Raw)
			n++
		}
		if n == 0 || len(bytes.TrimSpace(rest)) != 0 {
			return nil, fmt.Errorf("boot.secureBoot.dbCertificates[%d]: want PEM certificates only", i)
		}
	}
	return c, nil
}

func name384(d digest384) string { return "sha384:" + hex.EncodeToString(d[:]) }

// check compares the replayed CC event log's component view with the
// boot policy. The checks, in order, each with its reason:
//
//  1. EVENT_LOG_MISMATCH: the evidence carried a CC event log that
//     replayed, every RTMR[2] measurement the verifier cannot read
//     (Boot.Unexplained) is in extraMeasurements, and, with RTMR[1]
//     judged, no application was measured into it after
//     ExitBootServices (only the OS can have done that).
//  2. SECURE_BOOT_REQUIRED: Secure Boot is on unless allowed off; when
//     on, every db certificate is in dbCertificates.
//  3. COMPONENT_NOT_ALLOWED: the RTMR[1] applications fit ukis and
//     bootLoaders as uefilog.Placement places them (the TPM policy's
//     rule; TDX has no signed-PCR alternative, so an unlisted UKI is
//     refused), and a UKI was measured if ukis is set.
//  4. CMDLINE_NOT_ALLOWED: with no kernelCmdlines listed, no command
//     line was passed to systemd-stub (the UKI's own .cmdline comes with
//     the UKI); kernelCmdlines themselves are judged by checkCmdline.
func (c *compiledBoot) check(st *State, cmdlinesListed bool) error {
	b := st.Boot
	if b == nil {
		return mismatchf("the policy checks boot components, the evidence carries no CC event log")
	}
	for _, m := range b.Unexplained {
		if !slices.Contains(c.extra, m.Digest) {
			return mismatchf("rtmr 2: measurement %d (%s) is neither content-verified nor explained by the policy (boot.extraMeasurements)", m.Index, name384(m.Digest))
		}
	}
	if c.judged[rtmrBoot] && len(b.LateApplications) > 0 {
		m := b.LateApplications[0]
		return mismatchf("rtmr 1: measurement %d (%s) follows ExitBootServices; a judged RTMR[1] admits no application the OS measured", m.Index, name384(m.Digest))
	}
	if err := c.checkSecureBoot(b); err != nil {
		return err
	}
	p := uefilog.Placement[digest384]{UKIs: c.ukis, Loaders: c.loaders, Where: "rtmr 1", Sections: "rtmr 2", Name: name384}
	if _, _, err := p.Place(b.Applications, len(b.UKISections) > 0); err != nil {
		return err
	}
	if b.CmdlinePassed && !cmdlinesListed {
		return attest.Refuse(latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "kernel command line %q passed to the uki (rtmr 2) is not allowed: the policy lists no kernelCmdlines", b.Cmdline)
	}
	return nil
}

func (c *compiledBoot) checkSecureBoot(b *Boot) error {
	if !b.SecureBootEnabled {
		if c.allowSBOff {
			return nil
		}
		return attest.Refuse(latchkeyv1.Reason_SECURE_BOOT_REQUIRED, "secure boot is off (rtmr 0), the policy requires it")
	}
	for _, cert := range b.DB {
		if !slices.ContainsFunc(c.db, func(der []byte) bool { return bytes.Equal(der, cert.Raw) }) {
			d := sha256.Sum256(cert.Raw)
			return attest.Refuse(latchkeyv1.Reason_SECURE_BOOT_REQUIRED, "secure boot db certificate %q (sha256:%s) in rtmr 0 is not allowed", cert.Subject.String(), hex.EncodeToString(d[:]))
		}
	}
	return nil
}
