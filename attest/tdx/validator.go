package tdx

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/verify"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Validator checks TDX evidence against one compiled Policy. It is safe
// for concurrent use; a policy reload builds a new one.
type Validator struct {
	c    *compiled
	coll *Collateral
	pck  *pckCache
	now  func() time.Time
	// reportData is the REPORTDATA a binding must appear as
	// (wire.ReportData); tests of quotes made elsewhere replace it.
	reportData func(binding []byte) ([wire.ReportDataSize]byte, error)
}

var _ attest.Validator = (*Validator)(nil)

// ValidatorOption adjusts a Validator built by NewValidator.
type ValidatorOption func(*Validator)

// NewValidator compiles p and returns a Validator that reads collateral
// from c. c nil refuses every quote as COLLATERAL_MISSING: a TDX quote
// cannot be judged without Intel's TCB info.
func NewValidator(p Policy, c *Collateral, opts ...ValidatorOption) (*Validator, error) {
	comp, err := compile(p)
	if err != nil {
		return nil, fmt.Errorf("tdx policy: %w", err)
	}
	v := &Validator{c: comp, coll: c, pck: newPCKCache(), now: time.Now, reportData: wire.ReportData}
	for _, o := range opts {
		o(v)
	}
	return v, nil
}

// Variant is VARIANT_TDX.
func (v *Validator) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_TDX }

// Verify runs checks 1-9 and returns the verified state (Verified.State is
// a *State); it applies no reference value but the trusted roots. rt is
// unused: TDX needs no challenge. CheckPolicy runs checks 10-16 on that
// state. The first failure ends validation with a *attest.Refusal
// carrying the reason in brackets; every certificate and collateral date
// is checked at the validator's clock.
//
//  0. Binding length: a binding that is not attest.BindingSize bytes is a
//     caller error (a plain error, reason INTERNAL).
//  1. Decode [MALFORMED]: at most wire.MaxEvidenceSize bytes; a
//     TDXEvidence message without unknown fields; a quote go-tdx-guest's
//     abi parses as version 4 of a TDX TEE, every field its size, and no
//     byte after its signed data; a CCEL table and event log both present
//     (at most wire.MaxCCELTableSize and wire.MaxCCELSize bytes) or both
//     absent.
//  2. PCK chain [UNTRUSTED_CHAIN]: the quote's PCK certificate, with the
//     quote's intermediate (Intel SGX PCK Platform or Processor CA),
//     chains to one of the policy's trusted roots (Intel's SGX root CA by
//     default; the root the quote carries is ignored), and carries the
//     SGX extensions (PPID, FMSPC, PCEID, TCB). A chain verified before
//     (the same bytes) is taken from the validator's cache while the
//     clock is inside every certificate's validity (pckCache).
//  3. Collateral [COLLATERAL_MISSING when absent or out of date,
//     UNTRUSTED_CHAIN when forged]: from the Collateral cache, the TDX
//     TCB info for the PCK's FMSPC and the TD QE identity, each signed
//     (ECDSA P-256 over its JSON) by an "Intel SGX TCB Signing"
//     certificate that chains to a trusted root, of the expected ID and
//     version, between its issue date and next update; the PCK CA's CRL
//     signed by the quote's intermediate and the root CA's CRL signed by
//     the root, both current.
//  4. Revocation [UNTRUSTED_CHAIN]: neither the PCK certificate (PCK
//     CRL) nor the intermediate nor the certificates that signed the TCB
//     info and the QE identity (root CRL) is revoked.
//  5. Signature [BAD_SIGNATURE]: go-tdx-guest's verify.TdxQuote with no
//     network: the attestation key's signature over header and TD quote
//     body, the QE report's signature by the PCK key, and the QE report
//     data binding the attestation key.
//  6. Quoting enclave [UNTRUSTED_CHAIN]: the QE report matches the QE
//     identity (MRSIGNER, ISVPRODID, MISCSELECT and ATTRIBUTES under
//     their masks); its ISVSVN selects the QE TCB level, whose status
//     CheckPolicy judges.
//  7. TDX module and platform TCB [UNTRUSTED_CHAIN]: PCEID equal to the
//     TCB info's; MRSIGNERSEAM and the masked SEAM attributes equal to
//     the TCB info's TDX module; the platform TCB level is the first
//     whose SGX components and PCESVN (from the PCK certificate) and TDX
//     components (TEE_TCB_SVN) the platform meets, and, for a TDX module
//     of major version TEE_TCB_SVN[1] > 0, the module identity's level
//     for TEE_TCB_SVN[0]. No matching level is recorded, not refused
//     here: CheckPolicy refuses it.
//  8. Binding [BINDING_MISMATCH]: REPORTDATA is binding followed by 32
//     zero bytes.
//  9. Event log [EVENT_LOG_MISMATCH], when the evidence carries one: the
//     ACPI CCEL table names a TDX log, and go-eventlog's replay of every
//     RTMR the log extends gives the quoted value; the replayed events
//     read as a component view (Boot: Secure Boot variables that hash to
//     their digests, systemd-stub section pairs named once each). The
//     state then holds what the replayed events say (that view, the
//     kernel command line a boot loader measured, the EFI applications
//     loaded), nothing from events that did not replay.
func (v *Validator) Verify(ctx context.Context, evidence, binding []byte, _ attest.RoundTrip) (*attest.Verified, error) {
	if len(binding) != attest.BindingSize {
		return nil, fmt.Errorf("tdx: binding is %d bytes, want %d", len(binding), attest.BindingSize)
	}
	q, ev, err := decode(evidence)
	if err != nil {
		return nil, err
	}
	now := v.now()
	pck, err := v.checkChain(q, now)
	if err != nil {
		return nil, err
	}
	coll, err := v.collateral(pck, now)
	if err != nil {
		return nil, err
	}
	if err := v.checkSignature(ctx, q, now); err != nil {
		return nil, err
	}
	st := newState(q, pck)
	if err := checkQE(q, coll.qe, st); err != nil {
		return nil, err
	}
	if err := checkModule(q, pck, coll.tcb, st); err != nil {
		return nil, err
	}
	if err := v.checkBinding(q, binding); err != nil {
		return nil, err
	}
	if err := replayCCEL(ev, q, st); err != nil {
		return nil, err
	}
	return &attest.Verified{
		Variant:        latchkeyv1.Variant_VARIANT_TDX,
		EvidenceDigest: attest.EvidenceDigest(evidence),
		Identity:       "tdx-platform:" + hex.EncodeToString(st.PPID[:min(8, len(st.PPID))]),
		MachineID:      machineID(st, v.c.bindMRConfigID),
		State:          st,
	}, nil
}

// CheckPolicy runs checks 10-16 on a state Verify returned, in this order,
// the first failure ending the check with the reason in brackets. A state
// that is not a *State made by Verify is refused as INTERNAL
// (attest.StateMismatch).
//
//  10. MRTD [MEASUREMENT_NOT_ALLOWED]: listed in Policy.MRTDs.
//  11. RTMRs [PCR_MISMATCH]: each RTMR[i] listed in Policy.RTMRs[i], or
//     all zeros when that list is empty. An RTMR in Boot.JudgedRTMRs is
//     not compared with values: it must be the fold of the replayed CC
//     event log's events for it [EVENT_LOG_MISMATCH], and check 16
//     judges every one of those events.
//  12. Debug [DEBUG_POLICY]: ATTRIBUTES.DEBUG clear unless AllowDebug.
//  13. TD configuration [GUEST_POLICY_MISMATCH]: ATTRIBUTES, XFAM,
//     MRCONFIGID, MROWNER and MROWNERCONFIG each listed when the policy
//     lists any.
//  14. TEE TCB SVN [TCB_TOO_OLD]: every TEE_TCB_SVN byte at least
//     Policy.MinimumTeeTcbSvn's.
//  15. TCB status [TCB_TOO_OLD]: the platform's, the TDX module's (when
//     it has a major version) and the QE's TCB level exist (checks 6 and 7
//     found one each) and their statuses are each in Policy.TCBStatuses
//     (UpToDate alone by default).
//  16. Boot components, when Policy.Boot is set: the component view of
//     the replayed event log (Boot) passes compiledBoot.check (the UKI,
//     boot loaders, Secure Boot, unexplained RTMR[2] measurements; its
//     doc comment lists the reasons).
//  17. Kernel command line [CMDLINE_NOT_ALLOWED], when
//     Policy.KernelCmdlines lists any: a measured UKI .cmdline section
//     is SHA-384 of a listed line (with or without one trailing newline
//     or NUL); the replayed event log (check 9) holds a measured command
//     line (a boot loader's, or one passed to systemd-stub) or a .cmdline
//     section, and a measured command line is listed. No log, or a log
//     that measures none, is refused.
func (v *Validator) CheckPolicy(s attest.State) error {
	st, ok := s.(*State)
	if !ok || st == nil || !st.verified {
		return attest.StateMismatch(latchkeyv1.Variant_VARIANT_TDX, s)
	}
	c := v.c
	if !c.mrtds.Has(st.MRTD) {
		return attest.Refuse(latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED, "MRTD %s is not in the policy", hex.EncodeToString(st.MRTD))
	}
	for i, r := range st.RTMRs {
		if c.boot != nil && c.boot.judged[i] {
			if !st.EventLog || !st.replayed[i] {
				return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, "RTMR[%d] is judged by boot components (boot.judgedRTMRs) and no replayed CC event log accounts for it", i)
			}
			continue
		}
		if !c.rtmrs[i].Has(r) {
			return attest.Refuse(latchkeyv1.Reason_PCR_MISMATCH, "RTMR[%d] %s is not in the policy", i, hex.EncodeToString(r))
		}
	}
	if st.Debug() && !c.allowDebug {
		return attest.Refuse(latchkeyv1.Reason_DEBUG_POLICY, "TD attributes %s allow debugging", hex.EncodeToString(st.Attributes))
	}
	if err := c.checkConfig(st); err != nil {
		return err
	}
	if err := c.checkTCB(st); err != nil {
		return err
	}
	if c.boot != nil {
		if err := c.boot.check(st, c.cmdlines != nil); err != nil {
			return err
		}
	}
	return c.checkCmdline(st)
}

func (c *compiled) checkCmdline(st *State) error {
	if c.cmdlines == nil {
		return nil
	}
	var section bool
	if st.Boot != nil {
		var s UKISection
		if s, section = st.Boot.section(".cmdline"); section && !slices.Contains(c.cmdlineDigests, s.Digest) {
			return attest.Refuse(latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "uki .cmdline %s in rtmr 2 is not an allowed kernel command line", name384(s.Digest))
		}
	}
	if section && !st.HasKernelCmdline {
		return nil
	}
	if !st.EventLog || !st.HasKernelCmdline {
		return attest.Refuse(latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "the policy lists kernel command lines and no replayed event log measures one")
	}
	if !c.cmdlines[st.KernelCmdline] {
		return attest.Refuse(latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, "measured kernel command line %q is not in the policy", st.KernelCmdline)
	}
	return nil
}

func (c *compiled) checkConfig(st *State) error {
	fields := []struct {
		set   attest.ByteSet
		value []byte
		name  string
	}{
		{c.attributes, st.Attributes, "ATTRIBUTES"},
		{c.xfams, st.XFAM, "XFAM"},
		{c.mrConfigIDs, st.MRConfigID, "MRCONFIGID"},
		{c.mrOwners, st.MROwner, "MROWNER"},
		{c.mrOwnerConfigs, st.MROwnerConfig, "MROWNERCONFIG"},
	}
	for _, f := range fields {
		if f.set != nil && !f.set.Has(f.value) {
			return attest.Refuse(latchkeyv1.Reason_GUEST_POLICY_MISMATCH, "%s %s is not in the policy", f.name, hex.EncodeToString(f.value))
		}
	}
	return nil
}

func (c *compiled) checkTCB(st *State) error {
	if c.minTeeTcbSvn != nil {
		for i, m := range c.minTeeTcbSvn {
			if st.TeeTcbSvn[i] < m {
				return attest.Refuse(latchkeyv1.Reason_TCB_TOO_OLD, "TEE_TCB_SVN %s is below the minimum %s at byte %d",
					hex.EncodeToString(st.TeeTcbSvn), hex.EncodeToString(c.minTeeTcbSvn), i)
			}
		}
	}
	statuses := []struct {
		status pcs.TcbComponentStatus
		what   string
	}{
		{st.PlatformTCBStatus, "platform"},
		{st.ModuleTCBStatus, "TDX module"},
		{st.QETCBStatus, "quoting enclave"},
	}
	for _, s := range statuses {
		if s.status == NoTCBLevel {
			return attest.Refuse(latchkeyv1.Reason_TCB_TOO_OLD,
				"no %s TCB level of Intel's collateral matches (FMSPC %s, PCK CPUSVN %s, PCESVN %d, TEE_TCB_SVN %s, QE SVN %d)",
				s.what, st.FMSPC, hex.EncodeToString(st.CPUSVN), st.PCESVN, hex.EncodeToString(st.TeeTcbSvn), st.QESVN)
		}
		if s.status != "" && !c.statuses[s.status] {
			return attest.Refuse(latchkeyv1.Reason_TCB_TOO_OLD, "%s TCB status %s is not accepted by the policy", s.what, s.status)
		}
	}
	return nil
}

// minSignedData is the least signed data a version 4 quote carries: the
// ECDSA signature and attestation key (64 bytes each) and the
// certification data's type and size (2 + 4 bytes). go-tdx-guest's
// parser slices a shorter one out of bounds.
const minSignedData = 64 + 64 + 2 + 4

// quoteToProto is go-tdx-guest's quote parser, with a panic on hostile
// bytes (an input its checks did not foresee) turned into an error: a
// quote from the network must never crash the verifier.
func quoteToProto(raw []byte) (q any, err error) {
	defer func() {
		if r := recover(); r != nil {
			q, err = nil, fmt.Errorf("the quote parser failed on it: %v", r)
		}
	}()
	return abi.QuoteToProto(raw)
}

// decode runs check 1.
func decode(evidence []byte) (*pb.QuoteV4, *wire.Evidence, error) {
	ev, err := wire.DecodeEvidence(evidence)
	if err != nil {
		return nil, nil, malformed("%w", err)
	}
	raw := ev.Quote
	if want := wire.QuoteLength(raw); want < 0 || len(raw) != want {
		return nil, nil, malformed("quote: %d bytes, its signed data length says %d", len(raw), want)
	}
	if n := wire.SignedDataLength(raw); n < minSignedData {
		return nil, nil, malformed("quote: %d bytes of signed data, fewer than the %d its signature, attestation key and certification data header take", n, minSignedData)
	}
	anyQ, err := quoteToProto(raw)
	if err != nil {
		return nil, nil, malformed("quote: %w", err)
	}
	q, ok := anyQ.(*pb.QuoteV4)
	if !ok {
		return nil, nil, malformed("quote of type %T is not version 4", anyQ)
	}
	if err := abi.CheckQuoteV4(q); err != nil {
		return nil, nil, malformed("quote: %w", err)
	}
	if q.GetHeader().GetTeeType() != abi.TeeTDX {
		return nil, nil, malformed("quote is from TEE type %#x, not TDX", q.GetHeader().GetTeeType())
	}
	if len(q.GetTdQuoteBody().GetRtmrs()) != numRTMRs {
		return nil, nil, malformed("quote has %d RTMRs, want %d", len(q.GetTdQuoteBody().GetRtmrs()), numRTMRs)
	}
	return q, ev, nil
}

// pckInfo is the verified PCK chain of a quote (check 2).
type pckInfo struct {
	leaf, intermediate, root *x509.Certificate
	ext                      *pcs.PckExtensions
	ca                       string
}

// checkChain runs check 2, through the validator's PCK chain cache.
func (v *Validator) checkChain(q *pb.QuoteV4, now time.Time) (*pckInfo, error) {
	key := chainKey(q)
	if info := v.pck.get(key, now); info != nil {
		return info, nil
	}
	info, err := v.verifyChain(q, now)
	if err != nil {
		return nil, err
	}
	v.pck.put(key, info)
	return info, nil
}

// verifyChain is check 2 without the cache.
func (v *Validator) verifyChain(q *pb.QuoteV4, now time.Time) (*pckInfo, error) {
	chain, err := verify.ExtractChainFromQuote(q)
	if err != nil {
		return nil, untrusted("PCK certificate chain: %w", err)
	}
	leaf, inter := chain.PCKCertificate, chain.IntermediateCertificate
	if leaf == nil || inter == nil {
		return nil, untrusted("quote carries no PCK certificate and intermediate")
	}
	pool := x509.NewCertPool()
	pool.AddCert(inter)
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: v.c.roots, Intermediates: pool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil, untrusted("PCK certificate does not chain to a trusted root: %w", err)
	}
	ca, err := pckCA(inter)
	if err != nil {
		return nil, err
	}
	ext, err := pcs.PckCertificateExtensions(leaf)
	if err != nil {
		return nil, untrusted("PCK certificate extensions: %w", err)
	}
	if len(ext.TCB.CPUSvnComponents) != 16 {
		return nil, untrusted("PCK certificate has %d CPUSVN components, want 16", len(ext.TCB.CPUSvnComponents))
	}
	c := chains[0]
	return &pckInfo{leaf: leaf, intermediate: c[1], root: c[len(c)-1], ext: ext, ca: ca}, nil
}

// pckCA names the CA that issued the PCK certificate as Intel's CRL
// endpoint does.
func pckCA(inter *x509.Certificate) (string, error) {
	switch inter.Subject.CommonName {
	case "Intel SGX PCK Platform CA":
		return "platform", nil
	case "Intel SGX PCK Processor CA":
		return "processor", nil
	}
	return "", untrusted("PCK certificate is issued by %q, not an Intel SGX PCK CA", inter.Subject.CommonName)
}

// collateralSet is the verified collateral of one quote.
type collateralSet struct {
	tcb *pcs.TcbInfo
	qe  *pcs.EnclaveIdentity
}

// collateral runs checks 3 and 4.
func (v *Validator) collateral(pck *pckInfo, now time.Time) (*collateralSet, error) {
	if v.coll == nil {
		return nil, missing("no TDX collateral cache is configured (tdxCollateralDir); TCB info for FMSPC %s is needed", pck.ext.FMSPC)
	}
	tcb, tcbItem, err := v.coll.tcbInfo(pck.ext.FMSPC, v.c.roots, now)
	if err != nil {
		return nil, collateralRefusal(err)
	}
	qe, qeItem, err := v.coll.qeIdentity(v.c.roots, now)
	if err != nil {
		return nil, collateralRefusal(err)
	}
	pckCRL, err := v.coll.crl(PCKCRLFileName(pck.ca), pck.intermediate, now)
	if err != nil {
		return nil, collateralRefusal(err)
	}
	rootCRL, err := v.coll.crl(rootCRLFile, pck.root, now)
	if err != nil {
		return nil, collateralRefusal(err)
	}
	switch {
	case revoked(pckCRL, pck.leaf):
		return nil, untrusted("PCK certificate %s is revoked", pck.leaf.SerialNumber.Text(16))
	case revoked(rootCRL, pck.intermediate):
		return nil, untrusted("PCK CA certificate %s is revoked", pck.intermediate.SerialNumber.Text(16))
	case revoked(rootCRL, tcbItem.signer):
		return nil, untrusted("TCB signing certificate %s is revoked", tcbItem.signer.SerialNumber.Text(16))
	case revoked(rootCRL, qeItem.signer):
		return nil, untrusted("QE identity signing certificate %s is revoked", qeItem.signer.SerialNumber.Text(16))
	}
	return &collateralSet{tcb: tcb, qe: qe}, nil
}

func collateralRefusal(err error) error {
	var ce *collateralError
	if errors.As(err, &ce) && !ce.stale {
		return untrusted("collateral: %w", err)
	}
	return missing("%w", err)
}

// checkSignature runs check 5 through go-tdx-guest, with collateral and
// revocation off (checks 3 and 4 did them from the cache) so it makes no
// network request.
func (v *Validator) checkSignature(ctx context.Context, q *pb.QuoteV4, now time.Time) error {
	opts := &verify.Options{
		TrustedRoots: v.c.roots,
		Now:          &verify.TimeSet{PckCertChain: now, TcbInfo: now, QeIdentity: now, PckCrl: now, RootCaCrl: now},
		Getter:       noNetwork{},
	}
	if err := verify.TdxQuoteContext(ctx, q, opts); err != nil {
		return attest.Refuse(latchkeyv1.Reason_BAD_SIGNATURE, "quote signature: %w", err)
	}
	return nil
}

// noNetwork is the getter handed to go-tdx-guest: the join path never
// fetches, so any request is an error.
type noNetwork struct{}

func (noNetwork) Get(url string) (map[string][]string, []byte, error) {
	return nil, nil, fmt.Errorf("tdx: no network access on the join path (%s)", url)
}

// checkBinding runs check 8.
func (v *Validator) checkBinding(q *pb.QuoteV4, binding []byte) error {
	want, err := v.reportData(binding)
	if err != nil {
		return err
	}
	if !bytes.Equal(q.GetTdQuoteBody().GetReportData(), want[:]) {
		return attest.Refuse(latchkeyv1.Reason_BINDING_MISMATCH, "REPORTDATA is not this session's binding followed by zeros")
	}
	return nil
}

func malformed(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_MALFORMED, format, args...)
}

func untrusted(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_UNTRUSTED_CHAIN, format, args...)
}

func missing(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_COLLATERAL_MISSING, format, args...)
}
