package tdx

import (
	"crypto/sha512"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tdx-guest/pcs"

	"github.com/latchkey/latchkey/attest"
)

// Policy is the tdx section of the verifier's policy file: the trust
// anchor and the reference values an Intel TDX quote must match. It is
// parsed strictly and case-sensitively (verifier/policy, through
// internal/strictyaml), so field names are exactly the camelCase JSON tags
// below.
//
// Every reference value is a list, so an image upgrade rolls out by listing
// the old and new values together. The zero value accepts nothing: no MRTD
// listed means no quote passes, an RTMR with no listed value must be all
// zeros (never extended) unless Boot.JudgedRTMRs opts it into being
// judged by its boot components, debug TDs are refused, only the TCB status
// UpToDate is accepted, and only Intel's SGX root CA is trusted. Example:
//
//	mrtds: ["<96 hex digits>"]
//	rtmrs:
//	  - ["<96 hex digits>"]   # RTMR[0]: firmware configuration
//	  - ["<96 hex digits>"]   # RTMR[1]: boot loader and kernel
//	  - ["<96 hex digits>"]   # RTMR[2]: command line and initrd
//	minimumTeeTcbSvn: "03000400000000000000000000000000"
//	tcbStatuses: [UpToDate, SWHardeningNeeded]
type Policy struct {
	// MRTDs lists the accepted build-time measurements of the TD (MRTD,
	// 48 bytes, hex): the TD's firmware image as the host loaded it.
	MRTDs []string `json:"mrtds,omitempty"`
	// RTMRs lists, per runtime measurement register 0-3, the accepted
	// values (48 bytes, hex). At most four lists; a register with no list
	// (or an empty one) must be all zeros, unless Boot.JudgedRTMRs names
	// it (RTMR[1] and RTMR[2] only): then its boot components judge it.
	RTMRs [][]string `json:"rtmrs,omitempty"`
	// AllowDebug accepts a TD whose ATTRIBUTES has DEBUG set (the host can
	// read and write its memory). Default: refused.
	AllowDebug bool `json:"allowDebug,omitempty"`
	// Attributes, when not empty, lists the accepted TD ATTRIBUTES values
	// (8 bytes, hex, as in the quote); DEBUG is refused all the same unless
	// AllowDebug.
	Attributes []string `json:"attributes,omitempty"`
	// XFAMs, when not empty, lists the accepted XFAM values (8 bytes, hex):
	// the extended CPU features the TD may use.
	XFAMs []string `json:"xfams,omitempty"`
	// MRConfigIDs, MROwners and MROwnerConfigs, when not empty, list the
	// accepted values of those fields (48 bytes, hex each): software-defined
	// identities the host sets at TD creation.
	MRConfigIDs    []string `json:"mrConfigIDs,omitempty"`
	MROwners       []string `json:"mrOwners,omitempty"`
	MROwnerConfigs []string `json:"mrOwnerConfigs,omitempty"`
	// MinimumTeeTcbSvn is the component-wise minimum of TEE_TCB_SVN (16
	// bytes, hex; the TDX module's SVNs). "" checks nothing beyond the TCB
	// status.
	MinimumTeeTcbSvn string `json:"minimumTeeTcbSvn,omitempty"`
	// TCBStatuses lists the accepted TCB statuses Intel's TCB info assigns
	// to the platform and the QE identity assigns to the quoting enclave.
	// Empty means [UpToDate]. Others (SWHardeningNeeded,
	// ConfigurationNeeded, ConfigurationAndSWHardeningNeeded, OutOfDate,
	// OutOfDateConfigurationNeeded) pass only when listed; Revoked never.
	TCBStatuses []string `json:"tcbStatuses,omitempty"`
	// KernelCmdlines, when not empty, lists the accepted kernel command
	// lines as the boot loader measured them into RTMR[2] (without the
	// trailing NUL). It requires the agent to send the CC event log, which
	// the verifier replays against the RTMRs: no log, or a log that
	// measures no command line, is refused.
	KernelCmdlines []string `json:"kernelCmdlines,omitempty"`
	// Boot, when set, is the component policy over the replayed CC event
	// log: UKI, boot loaders, Secure Boot state and db (BootPolicy). It
	// requires the agent to send the CC event log.
	Boot *BootPolicy `json:"boot,omitempty"`
	// BindMRConfigID mixes MRCONFIGID into the machine identity disk UUIDs
	// and node names are bound to ("tdx-ppid:<PPID>/mrconfigid:<hex>").
	// Set it only when the platform gives every TD its own MRCONFIGID that
	// stays the same across its restarts; off, every TD on a platform
	// shares one identity.
	BindMRConfigID bool `json:"bindMRConfigID,omitempty"`
	// TrustedRoots, when not empty, replaces Intel's SGX root CA (which
	// go-tdx-guest ships, see IntelRootPEM) as the only trusted roots, in
	// PEM. The PCK chain and the TCB info and QE identity signing chains
	// must all end at one of them; tests use it for a fake chain.
	TrustedRoots []string `json:"trustedRoots,omitempty"`
}

// Sizes of the quote fields the policy compares.
const (
	measurementSize = 48
	attributesSize  = 8
	teeTcbSvnSize   = 16
	numRTMRs        = 4
)

// compiled is a Policy with every value decoded, ready for the hot path.
type compiled struct {
	mrtds          attest.ByteSet
	rtmrs          [numRTMRs]attest.ByteSet
	allowDebug     bool
	attributes     attest.ByteSet
	xfams          attest.ByteSet
	mrConfigIDs    attest.ByteSet
	mrOwners       attest.ByteSet
	mrOwnerConfigs attest.ByteSet
	minTeeTcbSvn   []byte
	statuses       map[pcs.TcbComponentStatus]bool
	bindMRConfigID bool
	cmdlines       map[string]bool
	cmdlineDigests []digest384
	boot           *compiledBoot
	roots          *x509.CertPool
	rootCerts      []*x509.Certificate
}

func compile(p Policy) (*compiled, error) {
	c := &compiled{allowDebug: p.AllowDebug, bindMRConfigID: p.BindMRConfigID}
	lists := []struct {
		dst  *attest.ByteSet
		src  []string
		size int
		name string
	}{
		{&c.mrtds, p.MRTDs, measurementSize, "mrtds"},
		{&c.attributes, p.Attributes, attributesSize, "attributes"},
		{&c.xfams, p.XFAMs, attributesSize, "xfams"},
		{&c.mrConfigIDs, p.MRConfigIDs, measurementSize, "mrConfigIDs"},
		{&c.mrOwners, p.MROwners, measurementSize, "mrOwners"},
		{&c.mrOwnerConfigs, p.MROwnerConfigs, measurementSize, "mrOwnerConfigs"},
	}
	for _, l := range lists {
		set, err := attest.HexSet(l.src, l.size, l.name)
		if err != nil {
			return nil, err
		}
		*l.dst = set
	}
	if c.mrtds == nil {
		c.mrtds = attest.ByteSet{} // nothing listed: nothing accepted
	}
	if err := c.compileRTMRs(p.RTMRs); err != nil {
		return nil, err
	}
	for _, s := range p.KernelCmdlines {
		if c.cmdlines == nil {
			c.cmdlines = map[string]bool{}
		}
		c.cmdlines[s] = true
		for _, v := range []string{s, s + "\n", s + "\x00"} {
			c.cmdlineDigests = append(c.cmdlineDigests, sha512.Sum384([]byte(v)))
		}
	}
	var err error
	if c.boot, err = compileBoot(p.Boot); err != nil {
		return nil, err
	}
	if c.boot != nil {
		if err := c.boot.compileJudged(&p); err != nil {
			return nil, err
		}
	}
	if p.MinimumTeeTcbSvn != "" {
		b, err := hex.DecodeString(p.MinimumTeeTcbSvn)
		if err != nil || len(b) != teeTcbSvnSize {
			return nil, fmt.Errorf("minimumTeeTcbSvn: want %d bytes of hex", teeTcbSvnSize)
		}
		c.minTeeTcbSvn = b
	}
	if c.statuses, err = parseStatuses(p.TCBStatuses); err != nil {
		return nil, err
	}
	if c.roots, c.rootCerts, err = compileRoots(p.TrustedRoots); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *compiled) compileRTMRs(lists [][]string) error {
	if len(lists) > numRTMRs {
		return fmt.Errorf("rtmrs: %d lists, a TD has %d RTMRs", len(lists), numRTMRs)
	}
	zero := string(make([]byte, measurementSize))
	for i := range numRTMRs {
		var src []string
		if i < len(lists) {
			src = lists[i]
		}
		set, err := attest.HexSet(src, measurementSize, fmt.Sprintf("rtmrs[%d]", i))
		if err != nil {
			return err
		}
		if set == nil {
			set = attest.ByteSet{zero: {}}
		}
		c.rtmrs[i] = set
	}
	return nil
}

// acceptableStatuses are the TCB statuses a policy may list. Revoked is
// not among them: a revoked TCB is never accepted.
var acceptableStatuses = []pcs.TcbComponentStatus{
	pcs.TcbComponentStatusUpToDate,
	pcs.TcbComponentStatusSwHardeningNeeded,
	pcs.TcbComponentStatusConfigurationNeeded,
	pcs.TcbComponentStatusConfigurationAndSWHardeningNeeded,
	pcs.TcbComponentStatusOutOfDate,
	pcs.TcbComponentStatusOutOfDateConfigurationNeeded,
}

func parseStatuses(list []string) (map[pcs.TcbComponentStatus]bool, error) {
	out := map[pcs.TcbComponentStatus]bool{}
	if len(list) == 0 {
		out[pcs.TcbComponentStatusUpToDate] = true
		return out, nil
	}
	for i, s := range list {
		st := pcs.TcbComponentStatus(s)
		if !slices.Contains(acceptableStatuses, st) {
			return nil, fmt.Errorf("tcbStatuses[%d]: %q is not one of %v", i, s, acceptableStatuses)
		}
		out[st] = true
	}
	return out, nil
}

// compileRoots parses the trusted roots: each a self-signed CA
// certificate. None listed means Intel's SGX root CA.
func compileRoots(list []string) (*x509.CertPool, []*x509.Certificate, error) {
	if len(list) == 0 {
		list = []string{IntelRootPEM}
	}
	pool := x509.NewCertPool()
	var certs []*x509.Certificate
	for i, s := range list {
		blk, rest := pem.Decode([]byte(s))
		if blk == nil || blk.Type != "CERTIFICATE" || len(trimSpace(rest)) != 0 {
			return nil, nil, fmt.Errorf("trustedRoots[%d]: want one PEM certificate", i)
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("trustedRoots[%d]: %w", i, err)
		}
		if !cert.IsCA {
			return nil, nil, errors.New("trustedRoots: certificate is not a CA")
		}
		if err := cert.CheckSignatureFrom(cert); err != nil {
			return nil, nil, fmt.Errorf("trustedRoots[%d]: not self-signed: %w", i, err)
		}
		pool.AddCert(cert)
		certs = append(certs, cert)
	}
	return pool, certs, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\r' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// IntelRootPEM is Intel's SGX Root CA (valid 2018-05-21 to 2049-12-31,
// SHA-256 fingerprint 44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3),
// the certificate go-tdx-guest embeds as its default root of trust. It is
// pinned here rather than read from go-tdx-guest so a dependency update
// cannot change the trust anchor unseen.
const IntelRootPEM = `-----BEGIN CERTIFICATE-----
MIICjzCCAjSgAwIBAgIUImUM1lqdNInzg7SVUr9QGzknBqwwCgYIKoZIzj0EAwIw
aDEaMBgGA1UEAwwRSW50ZWwgU0dYIFJvb3QgQ0ExGjAYBgNVBAoMEUludGVsIENv
cnBvcmF0aW9uMRQwEgYDVQQHDAtTYW50YSBDbGFyYTELMAkGA1UECAwCQ0ExCzAJ
BgNVBAYTAlVTMB4XDTE4MDUyMTEwNDUxMFoXDTQ5MTIzMTIzNTk1OVowaDEaMBgG
A1UEAwwRSW50ZWwgU0dYIFJvb3QgQ0ExGjAYBgNVBAoMEUludGVsIENvcnBvcmF0
aW9uMRQwEgYDVQQHDAtTYW50YSBDbGFyYTELMAkGA1UECAwCQ0ExCzAJBgNVBAYT
AlVTMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEC6nEwMDIYZOj/iPWsCzaEKi7
1OiOSLRFhWGjbnBVJfVnkY4u3IjkDYYL0MxO4mqsyYjlBalTVYxFP2sJBK5zlKOB
uzCBuDAfBgNVHSMEGDAWgBQiZQzWWp00ifODtJVSv1AbOScGrDBSBgNVHR8ESzBJ
MEegRaBDhkFodHRwczovL2NlcnRpZmljYXRlcy50cnVzdGVkc2VydmljZXMuaW50
ZWwuY29tL0ludGVsU0dYUm9vdENBLmRlcjAdBgNVHQ4EFgQUImUM1lqdNInzg7SV
Ur9QGzknBqwwDgYDVR0PAQH/BAQDAgEGMBIGA1UdEwEB/wQIMAYBAf8CAQEwCgYI
KoZIzj0EAwIDSQAwRgIhAOW/5QkR+S9CiSDcNoowLuPRLsWGf/Yi7GSX94BgwTwg
AiEA4J0lrHoMs+Xo5o/sX6O9QWxHRAvZUGOdRQ7cvqRXaqI=
-----END CERTIFICATE-----
`
