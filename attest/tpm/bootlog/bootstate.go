package bootlog

import (
	"crypto/sha256"
	"crypto/x509"

	"github.com/latchkey/latchkey/attest/uefilog"
)

// Boot is the verified, typed view of what the event logs say was
// measured: the input of the component policy and what `latchkey-agent
// measure` prints.
//
// The rule: every field comes from an event whose content hashes to its
// digest, or from the digest itself, in a PCR that replayed to its quoted
// value. Nothing a log says without the digest proving it is copied:
// event types, systemd's eventType labels, descriptions, the order of
// events across PCRs and which of the two logs carried an event are all
// unmeasured, and no field depends on them. An event in PCR 11 or 12 that
// is neither content-verified nor one of the kinds below is kept as
// Unexplained, by PCR, position and digest, and the component policy
// refuses it unless its digest is in boot.extraMeasurements.
//
// The events interpreted, by PCR:
//
//   - PCR 4 (firmware log only): by digest alone. The digests of the EFI
//     actions "Calling EFI Application from Boot Option" and "Returning
//     from EFI Application from Boot Option" (which ends a boot attempt)
//     and of the separators (0x00000000, 0xFFFFFFFF) are structure; every
//     other event is a boot application, whatever its event type says,
//     identified by its digest (the PE image's Authenticode hash).
//   - PCR 7 (firmware log only): go-eventlog's Secure Boot extraction,
//     which requires every event's data to hash to its digest and refuses
//     any event type it does not expect there.
//   - PCR 11 (both logs, firmware events first): a prefix of
//     systemd-stub section pairs, the first event's content hashing to
//     the section name with its NUL, the second's digest (the section's
//     contents) judged alone; then boot-phase words, each event's content
//     hashing to its digest; then, when the replay stops short of the
//     quote, the unlogged phase words of systemd 252 that extend it to
//     the quoted value (StandardPhases).
//   - PCR 12 (both logs): the first event whose content hashes to its
//     digest is the command line passed to systemd-stub.
//
// Systemd records in PCRs 0-7 are refused: only firmware measures there.
// Other PCRs (PCR 0's firmware, PCR 9's initrd, PCR 15's machine id) are
// replayed but not interpreted; a policy judges them by value.
type Boot struct {
	// SecureBoot is the Secure Boot state and databases (PCR 7).
	SecureBoot SecureBoot
	// Applications are the EFI boot applications in PCR 4, in measured
	// order.
	Applications []Application
	// UKISections are the sections systemd-stub measured into PCR 11, in
	// measurement order; empty when no systemd-stub ran.
	UKISections []UKISection
	// Cmdline is the kernel command line a boot loader passed to
	// systemd-stub (PCR 12, as text); empty when none was passed.
	Cmdline string
	// CmdlinePassed is true when Cmdline was measured (even if empty).
	CmdlinePassed bool
	// Phase is the systemd boot phase PCR 11 is in, the phase words
	// joined by ':' ("enter-initrd:leave-initrd:sysinit"), "" before the
	// first one. PhaseKnown is false when PCR 11 is not in the logs.
	Phase      string
	PhaseKnown bool
	// PCR11AtJoin is PCR 11 right after its first JoinPhaseWord
	// measurement, replayed from the logs (sealfacts.go); known only when
	// the replay passed that word.
	PCR11AtJoin      [sha256.Size]byte
	PCR11AtJoinKnown bool
	// Unexplained are the measurements in PCR 11 and 12 that are neither
	// content-verified nor of a kind interpreted above, in PCR and
	// measurement order.
	Unexplained []Measurement
}

// Measurement names one event of a PCR by what is measured about it.
type Measurement struct {
	PCR int
	// Index is the event's 1-based position among the PCR's extensions
	// (firmware log, then systemd log): the measured order, the same
	// whichever log carried it.
	Index  int
	Digest [sha256.Size]byte
}

// SecureBoot is the verified Secure Boot configuration.
type SecureBoot struct {
	Enabled bool
	// PK, KEK, DB and DBX are the certificates of the databases measured
	// before the PCR 7 separator; the Hashes fields their hash entries.
	PK, KEK, DB, DBX    []*x509.Certificate
	DBHashes, DBXHashes [][]byte
	PKHashes, KEKHashes [][]byte
	// Authorities are the certificates that verified the loaded images
	// (EV_EFI_VARIABLE_AUTHORITY after the separator).
	Authorities []*x509.Certificate
}

// Application is one EFI boot application (PCR 4), by its Authenticode
// SHA-256 digest.
type Application = uefilog.Application[[sha256.Size]byte]

// UKISection is one systemd-stub PCR 11 measurement.
type UKISection struct {
	// Name is the PE section name (".linux", ".cmdline", …).
	Name string
	// Digest is SHA-256 of the section's contents.
	Digest [sha256.Size]byte
}

// Section returns the UKI section called name, if measured.
func (b *Boot) Section(name string) (UKISection, bool) {
	for _, s := range b.UKISections {
		if s.Name == name {
			return s, true
		}
	}
	return UKISection{}, false
}
