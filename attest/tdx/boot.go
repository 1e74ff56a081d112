package tdx

import (
	"bytes"
	"crypto"
	"crypto/sha512"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/google/go-eventlog/extract"
	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/uefilog"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// The RTMRs the firmware's PCR measurements land in (the CC measurement
// protocol's MapPcrToMrIndex: PCR 1 and 7 to RTMR[0], 2-6 to RTMR[1],
// 8-15 to RTMR[2]; the log names CC MR index RTMR+1).
const (
	rtmrFirmware = 0 // PCR 1 (configuration), PCR 7 (Secure Boot)
	rtmrBoot     = 1 // PCR 4 (boot applications), PCR 5 (GPT, ExitBootServices)
	rtmrKernel   = 2 // PCR 11 (UKI sections), PCR 12 (command line), PCR 8-10
)

// digest384 is a SHA-384 measurement.
type digest384 = [sha512.Size384]byte

// Boot is the verified component view of a CC event log, the TDX
// counterpart of the TPM path's bootlog.Boot, read by the same rule:
// every field comes from an event whose content hashes to its digest, or
// from the digest itself, in an RTMR that replayed to its quoted value.
// Event types, descriptions and the order of events across RTMRs are not
// measured and nothing here depends on them. Unlike PCRs, one RTMR holds
// several PCRs' events, which the log does not tell apart, so each RTMR
// is read as a whole:
//
//   - RTMR[0]: go-eventlog's Secure Boot extraction (every variable
//     event's data must hash to its digest; unexpected types refused; no
//     authority measured before the separator), as the TPM path's PCR 7.
//   - RTMR[1]: by digest. The EFI actions around boot attempts and
//     ExitBootServices and the separators are structure (uefilog), and
//     so is an event whose content hashes to its digest and starts with
//     the GPT header's signature "EFI PART" (PCR 5's partition table: a
//     PE image's Authenticode bytes start with "MZ", so no application
//     can pass for it). Every other event is a boot application,
//     identified by its digest (the image's Authenticode SHA-384).
//   - RTMR[2]: one run of systemd-stub section pairs (the first event's
//     content hashing to the section name with its NUL, the second's
//     digest being the section's contents), starting at the first
//     section name; the first content-verified UTF-16 text that is not
//     a section name is the command line passed to systemd-stub. Every
//     other event (a boot loader's, the kernel's initrd measurement) is
//     Unexplained.
type Boot struct {
	// SecureBootEnabled and DB are the Secure Boot state and db
	// certificates measured before the RTMR[0] separator.
	SecureBootEnabled bool
	DB                []*x509.Certificate
	// Applications are the EFI boot applications in RTMR[1], in
	// measured order.
	Applications []uefilog.Application[digest384]
	// UKISections are the sections systemd-stub measured into RTMR[2].
	UKISections []UKISection
	// Cmdline is the command line passed to systemd-stub, when
	// CmdlinePassed.
	Cmdline       string
	CmdlinePassed bool
	// Unexplained are the RTMR[2] measurements read as none of the above.
	Unexplained []Measurement
	// LateApplications are the RTMR[1] applications measured after
	// ExitBootServices (also in Applications): only the OS measures
	// anything then.
	LateApplications []Measurement

	// kernelEvents counts the RTMR[2] measurements.
	kernelEvents int
	// roles, when not nil, records each event's Role (and sectionOf its
	// section's name) by RTMR and position in it.
	roles     map[[2]int]Role
	sectionOf map[[2]int]string
}

// Role is what the component view makes of one event of a CC event log.
type Role int

// The roles of RoleOf.
const (
	// RoleOther is any event of RTMR[0] or RTMR[3], and RTMR[1]'s
	// structure (EFI actions, separators, the partition table).
	RoleOther Role = iota
	// RoleApplication is an RTMR[1] boot application.
	RoleApplication
	// RoleSectionName and RoleSectionData are a systemd-stub section
	// pair in RTMR[2].
	RoleSectionName
	RoleSectionData
	// RoleCmdline is the command line passed to systemd-stub.
	RoleCmdline
	// RoleUnexplained is any other RTMR[2] event.
	RoleUnexplained
)

// LoggedEvent is one measurement of a CC event log with its role.
type LoggedEvent struct {
	// RTMR is the register it extends (the log's MR index minus one).
	RTMR   int
	Digest digest384
	Role   Role
	// Section names the section of a RoleSectionName or RoleSectionData.
	Section string
}

// ReadLog reads a CC event log (the CCEL table's log area) into its
// measurements, each with the role the component view gives it, by the
// rules of Boot, and that view without the Secure Boot state. It does
// not replay: the caller replays what it trusts (`policy predict` folds
// a reference boot's events, some replaced, into predicted RTMRs).
func ReadLog(log []byte) (out []LoggedEvent, b *Boot, err error) {
	defer func() { // go-eventlog panics on some malformed events
		if r := recover(); r != nil {
			out, b, err = nil, nil, errors.New("CC event log: malformed event")
		}
	}()
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, nil, fmt.Errorf("CC event log: %w", err)
	}
	events := el.Events(register.HashSHA384)
	by, err := byRTMR(events)
	if err != nil {
		return nil, nil, err
	}
	b = &Boot{roles: map[[2]int]Role{}, sectionOf: map[[2]int]string{}}
	b.readApplications(by[rtmrBoot])
	if err := b.readKernel(by[rtmrKernel]); err != nil {
		return nil, nil, err
	}
	pos := map[int]int{}
	for _, e := range events {
		if e.UntrustedType() == tcg.NoAction {
			continue
		}
		r := int(e.MRIndex()) - 1
		key := [2]int{r, pos[r]}
		pos[r]++
		out = append(out, LoggedEvent{RTMR: r, Digest: digest384(e.ReplayedDigest()), Role: b.roles[key], Section: b.sectionOf[key]})
	}
	return out, b, nil
}

func (b *Boot) role(rtmr, i int, r Role) {
	if b.roles != nil {
		b.roles[[2]int{rtmr, i}] = r
	}
}

// UKISection is one systemd-stub measurement of a UKI section.
type UKISection struct {
	Name   string
	Digest digest384
}

// Measurement names one RTMR[1] or RTMR[2] event by what is measured
// about it.
type Measurement struct {
	// Index is the event's 1-based position among the RTMR's extensions.
	Index  int
	Digest digest384
}

// section returns the UKI section called name, if measured.
func (b *Boot) section(name string) (UKISection, bool) {
	for _, s := range b.UKISections {
		if s.Name == name {
			return s, true
		}
	}
	return UKISection{}, false
}

var structure384 = uefilog.NewStructure(crypto.SHA384)

// gptSignature starts UEFI_GPT_DATA (the partition table header).
var gptSignature = []byte("EFI PART")

// readBoot builds the component view of replayed events; every failure
// is EVENT_LOG_MISMATCH.
func readBoot(events []tcg.Event) (*Boot, error) {
	by, err := byRTMR(events)
	if err != nil {
		return nil, err
	}
	b := &Boot{}
	if len(by[rtmrFirmware]) > 0 {
		sb, err := extract.ParseSecurebootState(by[rtmrFirmware], extract.RTMRRegisterConfig, extract.Opts{})
		if err != nil {
			return nil, mismatchf("CC event log: rtmr 0: %w", err)
		}
		if len(sb.PreSeparatorAuthority) != 0 {
			return nil, mismatchf("CC event log: rtmr 0: %d authorities before the separator", len(sb.PreSeparatorAuthority))
		}
		b.SecureBootEnabled = sb.Enabled
		for i := range sb.PermittedKeys {
			b.DB = append(b.DB, &sb.PermittedKeys[i])
		}
	}
	b.readApplications(by[rtmrBoot])
	if err := b.readKernel(by[rtmrKernel]); err != nil {
		return nil, err
	}
	return b, nil
}

// byRTMR groups measurements by RTMR.
func byRTMR(events []tcg.Event) (map[int][]tcg.Event, error) {
	by := map[int][]tcg.Event{}
	for _, e := range events {
		if e.UntrustedType() == tcg.NoAction {
			continue
		}
		if len(e.ReplayedDigest()) != sha512.Size384 {
			return nil, mismatchf("CC event log: event %d has no sha384 digest", e.Num())
		}
		if e.MRIndex() < 1 || e.MRIndex() > numRTMRs {
			return nil, mismatchf("CC event log: event %d names MR index %d", e.Num(), e.MRIndex())
		}
		by[int(e.MRIndex())-1] = append(by[int(e.MRIndex())-1], e)
	}
	return by, nil
}

func mismatchf(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, format, args...)
}

// exitBootServices384 is the digest of the ExitBootServices action.
var exitBootServices384 = sha512.Sum384([]byte(uefilog.ExitBootServices))

func (b *Boot) readApplications(events []tcg.Event) {
	attempt, exited := 1, false
	for i, e := range events {
		d := e.ReplayedDigest()
		switch {
		case string(d) == structure384.Returning:
			attempt++
		case bytes.Equal(d, exitBootServices384[:]):
			exited = true
		case structure384.Is(d):
		case bytes.HasPrefix(e.RawData(), gptSignature) && uefilog.Verified(crypto.SHA384, e.RawData(), d):
		default:
			b.Applications = append(b.Applications, uefilog.Application[digest384]{Digest: digest384(d), Attempt: attempt})
			b.role(rtmrBoot, i, RoleApplication)
			if exited {
				b.LateApplications = append(b.LateApplications, Measurement{Index: i + 1, Digest: digest384(d)})
			}
		}
	}
}

func (b *Boot) readKernel(events []tcg.Event) error {
	b.kernelEvents = len(events)
	run := -1 // -1 before the section pairs, their last index in them, -2 after
	for i := 0; i < len(events); i++ {
		e := events[i]
		d := digest384(e.ReplayedDigest())
		if run != -2 {
			if name, ok := uefilog.SectionName(crypto.SHA384, e.RawData(), d[:]); ok {
				if i+1 == len(events) {
					return mismatchf("rtmr 2: measurement %d is a section name without contents", i+1)
				}
				if _, dup := b.section(name); dup {
					return mismatchf("rtmr 2: section %s measured twice (measurement %d)", name, i+1)
				}
				b.UKISections = append(b.UKISections, UKISection{Name: name, Digest: digest384(events[i+1].ReplayedDigest())})
				b.role(rtmrKernel, i, RoleSectionName)
				b.role(rtmrKernel, i+1, RoleSectionData)
				if b.sectionOf != nil {
					b.sectionOf[[2]int{rtmrKernel, i}], b.sectionOf[[2]int{rtmrKernel, i + 1}] = name, name
				}
				run = i
				i++
				continue
			}
			if run >= 0 {
				run = -2
			}
		}
		if !b.CmdlinePassed && isUTF16(e.RawData()) && uefilog.Verified(crypto.SHA384, e.RawData(), d[:]) {
			b.Cmdline, b.CmdlinePassed = trimNUL(uefilog.DecodeText(e.RawData())), true
			b.role(rtmrKernel, i, RoleCmdline)
			continue
		}
		b.Unexplained = append(b.Unexplained, Measurement{Index: i + 1, Digest: d})
		b.role(rtmrKernel, i, RoleUnexplained)
	}
	return nil
}

// isUTF16 is true for data EFI code logs as UTF-16LE text with its NUL.
func isUTF16(b []byte) bool {
	return len(b) >= 2 && len(b)%2 == 0 && b[1] == 0 && b[len(b)-1] == 0 && b[len(b)-2] == 0
}

func trimNUL(s string) string {
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	return s
}
