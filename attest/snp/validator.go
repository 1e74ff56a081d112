package snp

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Validator checks SNP evidence against one compiled Policy. It is safe for
// concurrent use and takes no lock on the join path: the verified-chain
// cache is a sync.Map. A policy reload builds a new Validator (and so
// verifies each chip's chain once more, about 2 ms per chip).
type Validator struct {
	c        *compiled
	coll     *Collateral
	chains   chainCache
	now      func() time.Time
	log      *slog.Logger
	tcbCheck validate.Options
	// tcbVerdicts caches check 10 by tcbKey (bounded by tcbCount).
	tcbVerdicts sync.Map
	tcbCount    atomic.Int64
}

var _ attest.Validator = (*Validator)(nil)

// ValidatorOption adjusts a Validator built by NewValidator.
type ValidatorOption func(*Validator)

// NewValidator compiles p (hex values decoded, trusted roots parsed) and
// returns a Validator that takes VCEKs missing from a report's certificate
// table from c; c may be nil when every host supplies its certificates.
func NewValidator(p Policy, c *Collateral, opts ...ValidatorOption) (*Validator, error) {
	comp, err := compile(p)
	if err != nil {
		return nil, fmt.Errorf("snp policy: %w", err)
	}
	v := &Validator{c: comp, coll: c, now: time.Now, log: slog.Default()}
	for _, o := range opts {
		o(v)
	}
	v.tcbCheck = validate.Options{
		// Guest policy bits were decided by checks 7 and 8; here only the
		// TCB, SVN and firmware-version checks of validate can fail.
		GuestPolicy:               abi.SnpPolicy{MigrateMA: true, Debug: true, SMT: true, CXLAllowed: true},
		MinimumGuestSvn:           comp.minGuestSVN,
		MinimumTCB:                comp.minTCB,
		PermitProvisionalFirmware: comp.provisional,
	}
	return v, nil
}

// Variant is VARIANT_SNP.
func (v *Validator) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_SNP }

// Verify runs checks 1-5 (decoding, endorsement, chain, signature,
// binding) and returns the verified state (Verified.State is a *State); it
// applies no reference value but the trusted roots. rt is unused: SNP
// needs no challenge. CheckPolicy runs checks 6-10 on that state, and
// attest.Validate runs the two in order. The first failure ends
// validation with a *attest.Refusal carrying the reason in brackets:
//
//  0. Binding length: a binding that is not attest.BindingSize bytes is a
//     caller error (a plain error, reason INTERNAL).
//  1. Decode [MALFORMED]: at most MaxEvidenceSize bytes; an SNPEvidence
//     message without unknown fields; a report of exactly 1184 bytes that
//     go-sev-guest's abi parses (version 2-5, reserved bits zero, valid
//     guest policy encoding, ECDSA P-384 signature, signed by a VCEK or
//     VLEK); a certificate table of at most MaxCertTableSize bytes whose
//     entries lie inside it and name the signing key at most once.
//  2. Endorsement key [COLLATERAL_MISSING]: the VCEK or VLEK certificate
//     from the report's certificate table, else (VCEK only) the Collateral
//     entry for the report's CHIP_ID and REPORTED_TCB. The refusal names
//     both, so the operator knows what to fetch.
//  3. Chain [UNTRUSTED_CHAIN]: VCEK -> ASK (VLEK -> ASVK) -> ARK, checked
//     by go-sev-guest's verify.SnpAttestation against the policy's trusted
//     roots (AMD's Milan, Genoa and Turin roots by default) at the current
//     time, with the KDS certificate profile; and the certificate belongs
//     to the report: same key kind, HWID equal to CHIP_ID (unless the host
//     masks it), TCB equal to REPORTED_TCB. A verified chain is cached by
//     the SHA-256 of the certificate until its earliest expiry.
//  4. Signature [BAD_SIGNATURE]: the report's ECDSA P-384 signature by the
//     certified key (go-sev-guest's verify.SnpReportSignature).
//  5. Binding [BINDING_MISMATCH]: REPORT_DATA is binding followed by 32
//     zero bytes.
func (v *Validator) Verify(ctx context.Context, evidence, binding []byte, _ attest.RoundTrip) (*attest.Verified, error) {
	if len(binding) != attest.BindingSize {
		return nil, fmt.Errorf("snp: binding is %d bytes, want %d", len(binding), attest.BindingSize)
	}
	ev, err := wire.DecodeEvidence(evidence)
	if err != nil {
		return nil, err
	}
	der, err := v.endorsementDER(ctx, ev)
	if err != nil {
		return nil, err
	}
	e, err := v.checkEndorsement(ctx, ev, der)
	if err != nil {
		return nil, err
	}
	if err := checkBinding(ev.Report, binding); err != nil {
		return nil, err
	}
	return v.verified(evidence, ev, e, der), nil
}

// CheckPolicy runs checks 6-10 on a state Verify returned, in this
// order, the first failure ending the check with the reason in brackets.
// A state that is not a *State made by Verify (nil, built by hand, or
// another variant's) is refused as INTERNAL (attest.StateMismatch).
//
//  6. Measurement [MEASUREMENT_NOT_ALLOWED]: MEASUREMENT is listed in
//     Policy.Measurements.
//  7. Debug [DEBUG_POLICY]: the guest policy's DEBUG bit is clear.
//  8. Guest policy and identity [GUEST_POLICY_MISMATCH]: MIGRATE_MA clear
//     unless AllowMigrationAgent; CXL_ALLOW clear unless AllowCXL; SMT as
//     Policy.SMT says; ID_KEY_DIGEST, AUTHOR_KEY_DIGEST (with
//     AUTHOR_KEY_EN), FAMILY_ID, IMAGE_ID and HOST_DATA listed when the
//     policy lists any.
//  9. VMPL [VMPL_MISMATCH]: the report's VMPL is in Policy.VMPLs.
//  10. TCB [TCB_TOO_OLD]: go-sev-guest's validate.SnpAttestation: every
//     REPORTED_TCB component at least Policy.MinimumTCB, GUEST_SVN at
//     least MinimumGuestSVN, and committed firmware equal to the current
//     one unless PermitProvisionalFirmware.
func (v *Validator) CheckPolicy(s attest.State) error {
	st, ok := s.(*State)
	if !ok || st == nil || st.ev == nil {
		return attest.StateMismatch(latchkeyv1.Variant_VARIANT_SNP, s)
	}
	ev, der := st.ev, st.der
	r := ev.Report
	if !v.c.measurements.Has(r.GetMeasurement()) {
		return attest.Refuse(latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED,
			"measurement %s is not in the policy", hex.EncodeToString(r.GetMeasurement()))
	}
	gp, err := abi.ParseSnpPolicy(r.GetPolicy())
	if err != nil {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "guest policy: %w", err)
	}
	if gp.Debug {
		return attest.Refuse(latchkeyv1.Reason_DEBUG_POLICY, "guest policy %#x allows debugging", r.GetPolicy())
	}
	if err := v.checkGuestPolicy(ev, gp); err != nil {
		return err
	}
	if err := v.checkIdentity(ev); err != nil {
		return err
	}
	if vmpl := r.GetVmpl(); vmpl > 3 || !v.c.vmpls[vmpl] {
		return attest.Refuse(latchkeyv1.Reason_VMPL_MISMATCH, "report is from VMPL %d, policy accepts %v", r.GetVmpl(), v.vmplList())
	}
	return v.checkTCB(ev, der)
}

func checkBinding(r *spb.Report, binding []byte) error {
	data := r.GetReportData()
	if !bytes.Equal(data[:attest.BindingSize], binding) || !allZero(data[attest.BindingSize:]) {
		return attest.Refuse(latchkeyv1.Reason_BINDING_MISMATCH,
			"REPORT_DATA is not this session's binding followed by zeros")
	}
	return nil
}

func (v *Validator) checkGuestPolicy(ev *wire.Evidence, gp abi.SnpPolicy) error {
	switch {
	case gp.MigrateMA && !v.c.allowMA:
		return policyMismatch("guest policy allows a migration agent")
	case gp.CXLAllowed && !v.c.allowCXL:
		return policyMismatch("guest policy allows CXL")
	}
	// Unknown platform info bits from newer firmware are not an error here;
	// only SMT_EN matters.
	info, _ := abi.ParseSnpPlatformInfo(ev.Report.GetPlatformInfo())
	if info.SMTEnabled && v.c.smt != SMTAllowed {
		return policyMismatch("host runs with SMT enabled and the policy forbids it")
	}
	return nil
}

func (v *Validator) checkIdentity(ev *wire.Evidence) error {
	r := ev.Report
	fields := []struct {
		set   attest.ByteSet
		value []byte
		name  string
	}{
		{v.c.idKeys, r.GetIdKeyDigest(), "ID_KEY_DIGEST"},
		{v.c.authorKeys, r.GetAuthorKeyDigest(), "AUTHOR_KEY_DIGEST"},
		{v.c.familyIDs, r.GetFamilyId(), "FAMILY_ID"},
		{v.c.imageIDs, r.GetImageId(), "IMAGE_ID"},
		{v.c.hostData, r.GetHostData(), "HOST_DATA"},
	}
	for _, f := range fields {
		if f.set != nil && !f.set.Has(f.value) {
			return policyMismatch("%s %s is not in the policy", f.name, hex.EncodeToString(f.value))
		}
	}
	if v.c.authorKeys != nil && !ev.Signer.AuthorKeyEn {
		return policyMismatch("policy lists author keys and AUTHOR_KEY_EN is clear")
	}
	return nil
}

// checkTCB runs go-sev-guest's field validation with only the TCB, SVN
// and firmware options set (check 10). Its verdict depends only on the
// fields in tcbKey (every other option is unset or already decided), so
// it is computed once per distinct key: validate.SnpAttestation re-parses
// the certificate on every call, which would cost a tenth of a join.
func (v *Validator) checkTCB(ev *wire.Evidence, der []byte) error {
	r := ev.Report
	key := tcbKey{
		current: r.GetCurrentTcb(), reported: r.GetReportedTcb(), committed: r.GetCommittedTcb(), launch: r.GetLaunchTcb(),
		guestSVN: r.GetGuestSvn(),
		firmware: [6]uint32{r.GetCurrentBuild(), r.GetCurrentMinor(), r.GetCurrentMajor(),
			r.GetCommittedBuild(), r.GetCommittedMinor(), r.GetCommittedMajor()},
	}
	if verdict, ok := v.tcbVerdicts.Load(key); ok {
		return verdict.(tcbVerdict).err
	}
	chain := &spb.CertificateChain{}
	if ev.Signer.SigningKey == abi.VlekReportSigner {
		chain.VlekCert = der
	} else {
		chain.VcekCert = der
	}
	opts := v.tcbCheck
	var err error
	if verr := validate.SnpAttestation(&spb.Attestation{Report: r, CertificateChain: chain}, &opts); verr != nil {
		err = attest.Refuse(latchkeyv1.Reason_TCB_TOO_OLD, "%w", verr)
	}
	if v.tcbCount.Load() < maxCachedChains {
		if _, loaded := v.tcbVerdicts.LoadOrStore(key, tcbVerdict{err}); !loaded {
			v.tcbCount.Add(1)
		}
	}
	return err
}

// tcbKey holds the report fields check 10 reads. The certificate's TCB is
// not part of it: check 3 made it equal to REPORTED_TCB.
type tcbKey struct {
	current, reported, committed, launch uint64
	guestSVN                             uint32
	firmware                             [6]uint32
}

type tcbVerdict struct{ err error }

func (v *Validator) vmplList() []int {
	var out []int
	for i, ok := range v.c.vmpls {
		if ok {
			out = append(out, i)
		}
	}
	return out
}

func (v *Validator) verified(evidence []byte, ev *wire.Evidence, e *endorsement, der []byte) *attest.Verified {
	r := ev.Report
	gp, _ := abi.ParseSnpPolicy(r.GetPolicy())
	st := &State{
		ProductLine:        e.productLine,
		SigningKey:         ev.Signer.SigningKey.String(),
		ReportVersion:      r.GetVersion(),
		ChipID:             r.GetChipId(),
		Measurement:        r.GetMeasurement(),
		ReportedTCB:        wire.TCBFromVersion(r.GetReportedTcb()),
		ReportedTCBVersion: r.GetReportedTcb(),
		GuestSVN:           r.GetGuestSvn(),
		GuestPolicy:        gp,
		VMPL:               r.GetVmpl(),
		PlatformInfo:       r.GetPlatformInfo(),
		HostData:           r.GetHostData(),
		FamilyID:           r.GetFamilyId(),
		ImageID:            r.GetImageId(),
		IDKeyDigest:        r.GetIdKeyDigest(),
		AuthorKeyDigest:    r.GetAuthorKeyDigest(),
		ReportID:           r.GetReportId(),
		ev:                 ev,
		der:                der,
	}
	return &attest.Verified{
		Variant:        latchkeyv1.Variant_VARIANT_SNP,
		EvidenceDigest: attest.EvidenceDigest(evidence),
		Identity:       identity(r.GetChipId()),
		MachineID:      machineID(r.GetChipId(), r.GetHostData(), v.c.bindHostData),
		State:          st,
	}
}

// State is the verified machine state of an SNP join (attest.Verified's
// State). Every field comes from a report whose decoding, endorsement,
// chain, signature and binding checks (Verify) passed; CheckPolicy judges
// it.
type State struct {
	// ProductLine is Milan, Genoa or Turin.
	ProductLine string
	// SigningKey is "VCEK" or "VLEK".
	SigningKey         string
	ReportVersion      uint32
	ChipID             []byte
	Measurement        []byte
	ReportedTCB        TCB
	ReportedTCBVersion uint64
	GuestSVN           uint32
	GuestPolicy        abi.SnpPolicy
	VMPL               uint32
	PlatformInfo       uint64
	HostData           []byte
	FamilyID           []byte
	ImageID            []byte
	IDKeyDigest        []byte
	AuthorKeyDigest    []byte
	ReportID           []byte

	// ev and der are the verified report and its endorsement certificate,
	// for CheckPolicy (go-sev-guest's TCB validation reads them whole).
	ev  *wire.Evidence
	der []byte
}

var _ attest.State = (*State)(nil)

// Variant is VARIANT_SNP; it makes *State an attest.State.
func (*State) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_SNP }

// Keys is the chip, by its CHIP_ID in lower-case hex (all zeros when the
// host masks it); none when the state holds no 64-byte CHIP_ID.
func (s *State) Keys() []attest.Key {
	if len(s.ChipID) != abi.ChipIDSize {
		return nil
	}
	return []attest.Key{{Kind: attest.KeySNPChip, Value: hex.EncodeToString(s.ChipID)}}
}

// identity names a chip for humans: "chip:" and the first 8 bytes of
// CHIP_ID in hex, or "chip:masked" when the host masks it.
func identity(chipID []byte) string {
	if allZero(chipID) || len(chipID) < 8 {
		return "chip:masked"
	}
	return "chip:" + hex.EncodeToString(chipID[:8])
}

// machineID is the identity bindings use: the whole CHIP_ID (the report
// holds nothing per VM that survives a restart on another host), with
// HOST_DATA appended when the policy says the platform sets one per VM.
// A masked CHIP_ID gives "" (no stable identity).
func machineID(chipID, hostData []byte, bindHostData bool) string {
	if allZero(chipID) {
		return ""
	}
	id := "snp-chip:" + hex.EncodeToString(chipID)
	if bindHostData {
		id += "/host-data:" + hex.EncodeToString(hostData)
	}
	return id
}

// endorsementDER returns the signing key's certificate (check 2).
func (v *Validator) endorsementDER(ctx context.Context, ev *wire.Evidence) ([]byte, error) {
	if ev.Endorsement != nil {
		return ev.Endorsement, nil
	}
	r := ev.Report
	if ev.Signer.SigningKey == abi.VlekReportSigner {
		return nil, missing("report is signed by a VLEK and its certificate table has no VLEK certificate (a VLEK comes only from the host)")
	}
	if allZero(r.GetChipId()) {
		return nil, missing("report has no VCEK certificate and its CHIP_ID is masked, so no cached VCEK can be found")
	}
	need := describeVCEK(reportProductLine(r), r.GetChipId(), r.GetReportedTcb())
	if v.coll == nil {
		return nil, missing("no VCEK certificate in the report and no collateral cache configured; need %s", need)
	}
	// Collateral.VCEK logs read errors and reports them as a miss.
	der, err := v.coll.VCEK(ctx, reportProductLine(r), r.GetChipId(), r.GetReportedTcb())
	if err != nil {
		return nil, missing("no VCEK certificate in the report or the collateral cache; need %s", need)
	}
	return der, nil
}

// describeVCEK names the VCEK a report needs, in the terms of
// `latchkey-verifier collateral fetch`.
func describeVCEK(productLine string, chipID []byte, tcb uint64) string {
	if productLine == "" {
		productLine = "unknown product line (report version 2)"
	}
	p := kds.DecomposeTCBVersion(kds.TCBVersion(tcb))
	return fmt.Sprintf("VCEK for %s chip ID %s at TCB %#016x (bootloader %d, tee %d, snp %d, microcode %d)",
		productLine, hex.EncodeToString(chipID), tcb, p.BlSpl, p.TeeSpl, p.SnpSpl, p.UcodeSpl)
}

func missing(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_COLLATERAL_MISSING, format, args...)
}

func policyMismatch(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_GUEST_POLICY_MISMATCH, format, args...)
}
