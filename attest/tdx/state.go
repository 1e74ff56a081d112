package tdx

import (
	"encoding/hex"
	"slices"

	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// NoTCBLevel is the TCB status recorded when Intel's collateral lists no
// TCB level the platform, TDX module or QE meets. No policy accepts it.
const NoTCBLevel pcs.TcbComponentStatus = "NoMatchingTCBLevel"

// State is the verified machine state of a TDX join (attest.Verified's
// State). Every field comes from a quote whose decoding, chain,
// collateral, signature, QE, TDX module and binding checks (Verify)
// passed; CheckPolicy judges it.
type State struct {
	// MRTD is the TD's build-time measurement (48 bytes).
	MRTD []byte
	// RTMRs are the four runtime measurement registers (48 bytes each).
	RTMRs [numRTMRs][]byte
	// Attributes is TDATTRIBUTES (8 bytes, as in the quote); bit 0 is
	// DEBUG.
	Attributes []byte
	// XFAM is the TD's extended feature mask (8 bytes).
	XFAM []byte
	// MRConfigID, MROwner and MROwnerConfig are the host-set identities
	// (48 bytes each).
	MRConfigID, MROwner, MROwnerConfig []byte
	// TeeTcbSvn is the TDX module's TEE_TCB_SVN (16 bytes).
	TeeTcbSvn []byte
	// MRSeam is the TDX module's measurement (48 bytes).
	MRSeam []byte
	// ReportData is the quote's REPORTDATA (64 bytes).
	ReportData []byte

	// PPID is the platform provisioning ID of the PCK certificate (16
	// bytes): the platform's stable identity.
	PPID []byte
	// FMSPC names the platform family whose TCB info applied (12 hex).
	FMSPC string
	// CPUSVN and PCESVN are the platform TCB the PCK certificate names.
	CPUSVN []byte
	PCESVN uint16
	// QESVN is the quoting enclave's ISVSVN.
	QESVN uint32

	// PlatformTCBStatus, ModuleTCBStatus (empty for a module without a
	// major version) and QETCBStatus are the statuses Intel's collateral
	// assigns; NoTCBLevel when none applies.
	PlatformTCBStatus, ModuleTCBStatus, QETCBStatus pcs.TcbComponentStatus
	// TCBDate and AdvisoryIDs are the platform TCB level's.
	TCBDate     string
	AdvisoryIDs []string

	// EventLog says the evidence carried a CC event log that replayed to
	// the RTMRs; the fields below come from its events and are zero
	// without one.
	EventLog bool
	// KernelCmdline is the kernel command line a boot loader measured:
	// GRUB's (go-eventlog's extraction) or the one passed to
	// systemd-stub (Boot.Cmdline), its trailing NUL cut, when
	// HasKernelCmdline.
	KernelCmdline    string
	HasKernelCmdline bool
	// Boot is the component view of the replayed log (nil without one).
	Boot *Boot
	// EFIApps are the SHA-384 digests (hex) of the EFI applications the
	// firmware loaded, in order.
	EFIApps []string

	// verified marks a state Verify made.
	verified bool
	// replayed marks the RTMRs the replayed log's events fold to.
	replayed [numRTMRs]bool
}

var _ attest.State = (*State)(nil)

func newState(q *pb.QuoteV4, pck *pckInfo) *State {
	b := q.GetTdQuoteBody()
	st := &State{
		MRTD:          slices.Clone(b.GetMrTd()),
		Attributes:    slices.Clone(b.GetTdAttributes()),
		XFAM:          slices.Clone(b.GetXfam()),
		MRConfigID:    slices.Clone(b.GetMrConfigId()),
		MROwner:       slices.Clone(b.GetMrOwner()),
		MROwnerConfig: slices.Clone(b.GetMrOwnerConfig()),
		TeeTcbSvn:     slices.Clone(b.GetTeeTcbSvn()),
		MRSeam:        slices.Clone(b.GetMrSeam()),
		ReportData:    slices.Clone(b.GetReportData()),
		FMSPC:         pck.ext.FMSPC,
		CPUSVN:        slices.Clone(pck.ext.TCB.CPUSvnComponents),
		PCESVN:        pck.ext.TCB.PCESvn,
		verified:      true,
	}
	for i, r := range b.GetRtmrs() {
		st.RTMRs[i] = slices.Clone(r)
	}
	st.PPID, _ = hex.DecodeString(pck.ext.PPID)
	return st
}

// Variant is VARIANT_TDX; it makes *State an attest.State.
func (*State) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_TDX }

// Debug reports whether ATTRIBUTES.DEBUG (bit 0) is set.
func (s *State) Debug() bool { return len(s.Attributes) > 0 && s.Attributes[0]&1 != 0 }

// Keys is the platform, by its PPID in lower-case hex; none when the PCK
// certificate carried no PPID.
func (s *State) Keys() []attest.Key {
	if len(s.PPID) == 0 {
		return nil
	}
	return []attest.Key{{Kind: attest.KeyTDXPPID, Value: hex.EncodeToString(s.PPID)}}
}

// machineID is the identity bindings use (see the package doc):
// "tdx-ppid:<PPID>", with "/mrconfigid:<hex>" appended when the policy
// binds MRCONFIGID. A PCK certificate without a PPID gives "" (no stable
// identity).
func machineID(st *State, bindMRConfigID bool) string {
	if len(st.PPID) == 0 {
		return ""
	}
	id := string(attest.KeyTDXPPID) + ":" + hex.EncodeToString(st.PPID)
	if bindMRConfigID {
		id += "/mrconfigid:" + hex.EncodeToString(st.MRConfigID)
	}
	return id
}
