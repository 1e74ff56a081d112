package bootlog

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-eventlog/extract"
	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/wire"
	"github.com/latchkey/latchkey/attest/uefilog"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// PCRs systemd-stub and systemd measure into (systemd's TPM2 PCR
// assignments).
const (
	pcrBootApps   = 4 // EFI boot applications (firmware)
	pcrSecureBoot = 7 // Secure Boot state (firmware)
	// PCRKernel holds the UKI sections (systemd-stub) and boot phases.
	PCRKernel     = 11
	pcrKernelArgs = 12 // command line, credentials (systemd-stub)
)

// StandardPhases are the boot-phase words systemd-pcrphase measures into
// PCR 11, in boot order. When systemd keeps no userspace log (systemd
// 252), the phase PCR 11 is in is found by extending the replayed
// systemd-stub value with each prefix of this chain.
var StandardPhases = []string{"enter-initrd", "leave-initrd", "sysinit", "ready", "shutdown", "final"}

// candidatePhases are the unlogged phase chains systemd 252 can leave in
// PCR 11: each prefix of StandardPhases, and each prefix of its main-system
// part ("sysinit", …) for an initrd without systemd (initramfs-tools, as
// Debian's default initrd), where nothing measures enter-initrd.
func candidatePhases() []string {
	var out []string
	for _, chain := range [][]string{StandardPhases, StandardPhases[2:]} {
		for i := range chain {
			out = append(out, strings.Join(chain[:i+1], ":"))
		}
	}
	return out
}

// Extend is TPM2_PCR_Extend for SHA-256.
func Extend(pcr, digest [sha256.Size]byte) [sha256.Size]byte {
	return sha256.Sum256(append(pcr[:], digest[:]...))
}

// ExtendPhase extends pcr with each ':'-separated word of phase, as
// systemd-pcrphase does (SHA-256 of the word, no NUL). "" leaves pcr as is.
func ExtendPhase(pcr [sha256.Size]byte, phase string) [sha256.Size]byte {
	if phase == "" {
		return pcr
	}
	for _, w := range strings.Split(phase, ":") {
		pcr = Extend(pcr, sha256.Sum256([]byte(w)))
	}
	return pcr
}

// mismatch is an EVENT_LOG_MISMATCH refusal.
func mismatch(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, format, args...)
}

// Verify replays a firmware and a systemd event log against PCR values
// and returns what they verifiably say; it is what `latchkey-agent
// measure` runs on the machine's own PCRs. Every failure is an
// *attest.Refusal (see Replay for the checks).
func Verify(pcrs map[int][sha256.Size]byte, firmwareLog, systemdLog []byte) (*Boot, error) {
	raw := make(map[int][]byte, len(pcrs))
	for p, v := range pcrs {
		raw[p] = v[:]
	}
	return Replay(raw, firmwareLog, systemdLog)
}

// Replay is the TPM validator's event-log step: it replays the event logs against the quoted PCRs and returns
// what they verifiably say (Boot's doc comment states the rule and the
// events interpreted). Its checks, in order:
//
//  1. Decoding (MALFORMED): the firmware log is a TCG2 crypto-agile log
//     with SHA-256 digests (go-eventlog's parser) of at most
//     wire.MaxFirmwareLogSize bytes and wire.MaxFirmwareEvents events; the systemd
//     log decodes (wire.DecodeSystemdLog).
//  2. Coverage (EVENT_LOG_MISMATCH): no systemd record extends a
//     firmware PCR (0-7), and every PCR either log extends must be
//     quoted, so no measurement escapes the replay.
//  3. Replay (EVENT_LOG_MISMATCH): every PCR the firmware log alone
//     touches and this package does not interpret must replay to its
//     quoted value with go-eventlog's replay (and its workarounds for
//     known firmware bugs); PCRs 4, 11, 12 and every PCR systemd's log
//     touches must replay firmware events then systemd events to it; PCR
//     11 may then be followed by a prefix of StandardPhases, unlogged
//     (systemd 252). The refusal names the PCR, the replayed and the
//     quoted value.
//  4. Structure (EVENT_LOG_MISMATCH): go-eventlog's extraction of the
//     Secure Boot state (PCR 7: variables before the separator, digests
//     matching data, no debugger, no authority before the separator);
//     systemd-stub's PCR 11 section pairs must name each section once
//     and end with its contents.
//
// The returned Boot holds only values of events that replayed.
func Replay(pcrs map[int][]byte, fwLog, sdLog []byte) (b *Boot, err error) {
	defer func() { // go-eventlog panics on some unknown event types
		if r := recover(); r != nil {
			b, err = nil, attest.Refuse(latchkeyv1.Reason_MALFORMED, "firmware event log: malformed event")
		}
	}()
	el, raw, sd, err := decodeLogs(fwLog, sdLog)
	if err != nil {
		return nil, attest.Refuse(latchkeyv1.Reason_MALFORMED, "%w", err)
	}
	byPCR := groupByPCR(raw)
	sdByPCR, err := groupSystemd(sd)
	if err != nil {
		return nil, err
	}
	touched, err := touchedPCRs(pcrs, byPCR, sdByPCR)
	if err != nil {
		return nil, err
	}
	fwOnly, own := splitReplay(pcrs, touched, sdByPCR)
	// Firmware-only PCRs first: they are the lower ones (0-7), so the
	// refusal names the earliest component that differs.
	events, err := el.Verify(fwOnly)
	if err != nil {
		return nil, replayRefusal(fwOnly, byPCR)
	}
	recs := map[int][]record{}
	var phaseSuffix string
	for _, p := range own {
		recs[p] = records(byPCR[p], sdByPCR[p])
		suffix, err := replayOwn(p, pcrs[p], recs[p], len(sdByPCR[p]) > 0)
		if err != nil {
			return nil, err
		}
		if p == PCRKernel {
			phaseSuffix = suffix
		}
	}
	b = &Boot{}
	if err := b.extractSecureBoot(events); err != nil {
		return nil, err
	}
	b.extractApplications(recs[pcrBootApps])
	if _, ok := recs[PCRKernel]; ok {
		if err := b.interpretKernel(recs[PCRKernel], phaseSuffix); err != nil {
			return nil, err
		}
	}
	b.interpretArgs(recs[pcrKernelArgs])
	return b, nil
}

func decodeLogs(fwLog, sdLog []byte) (*tcg.EventLog, []tcg.Event, []wire.SystemdEvent, error) {
	if len(fwLog) > wire.MaxFirmwareLogSize {
		return nil, nil, nil, fmt.Errorf("firmware event log has %d bytes, limit %d", len(fwLog), wire.MaxFirmwareLogSize)
	}
	el, err := tcg.ParseEventLog(fwLog, tcg.ParseOpts{})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("firmware event log: %w", err)
	}
	if !slices.Contains(el.Algs, register.HashSHA256) {
		return nil, nil, nil, errors.New("firmware event log has no sha256 digests")
	}
	raw := el.Events(register.HashSHA256)
	if len(raw) > wire.MaxFirmwareEvents {
		return nil, nil, nil, fmt.Errorf("firmware event log has %d events, limit %d", len(raw), wire.MaxFirmwareEvents)
	}
	for i, e := range raw {
		if e.Type != tcg.NoAction && len(e.Digest) != sha256.Size {
			return nil, nil, nil, fmt.Errorf("firmware event log event %d (pcr %d) has no sha256 digest", i, e.Index)
		}
		if e.Index < 0 || e.Index > wire.MaxPCR {
			return nil, nil, nil, fmt.Errorf("firmware event log event %d names pcr %d", i, e.Index)
		}
	}
	var sd []wire.SystemdEvent
	if len(sdLog) > 0 {
		if sd, err = wire.DecodeSystemdLog(sdLog); err != nil {
			return nil, nil, nil, err
		}
	}
	return el, raw, sd, nil
}

// replayFirmware folds firmware events the way TPM2_PCR_Extend does,
// from zero (the PCRs replayed here are never reset by an H-CRTM).
func replayFirmware(events []tcg.Event) [sha256.Size]byte {
	var v [sha256.Size]byte
	for _, e := range events {
		v = Extend(v, [sha256.Size]byte(e.Digest))
	}
	return v
}

// replayRefusal names the lowest PCR whose firmware replay fails. PCR 0
// may start from a locality or H-CRTM value go-eventlog knows about; when
// the plain fold happens to match, the detail says so rather than guess.
func replayRefusal(mrs []register.MR, byPCR map[int][]tcg.Event) error {
	for _, mr := range mrs {
		got := replayFirmware(byPCR[mr.Idx()])
		if !bytes.Equal(got[:], mr.Dgst()) {
			return mismatch("pcr %d: firmware event log replays to %s, the quote holds %s", mr.Idx(), hex.EncodeToString(got[:]), hex.EncodeToString(mr.Dgst()))
		}
	}
	return mismatch("firmware event log does not replay to the quoted pcrs %v", mrIndices(mrs))
}

func mrIndices(mrs []register.MR) []int {
	out := make([]int, len(mrs))
	for i, mr := range mrs {
		out[i] = mr.Idx()
	}
	return out
}

// record is one extension of a PCR whichever log carried it: its digest
// and the content the log claims was measured (a firmware event's data, a
// systemd record's string). Nothing else a log says about an event is
// kept, so no interpretation can depend on it.
type record struct {
	digest [sha256.Size]byte
	data   []byte
}

// verified reports whether the record's content is what was measured.
func (r record) verified() bool { return sha256.Sum256(r.data) == r.digest }

// records lists a PCR's extensions in measured order: firmware events,
// then systemd's (systemd only measures after the firmware is done).
func records(fw []tcg.Event, sd []wire.SystemdEvent) []record {
	out := make([]record, 0, len(fw)+len(sd))
	for _, e := range fw {
		out = append(out, record{digest: [sha256.Size]byte(e.Digest), data: e.Data})
	}
	for _, e := range sd {
		out = append(out, record{digest: e.Digest, data: []byte(e.Content)})
	}
	return out
}

// replayOwn replays a PCR this package interprets or that systemd
// extends. For PCR 11 a replay that stops short may be completed by the
// unlogged phase words of systemd 252, which it returns.
func replayOwn(p int, quoted []byte, recs []record, withSystemd bool) (string, error) {
	var v [sha256.Size]byte
	for _, r := range recs {
		v = Extend(v, r.digest)
	}
	if bytes.Equal(v[:], quoted) {
		return "", nil
	}
	if p == PCRKernel {
		for _, phase := range candidatePhases() {
			if got := ExtendPhase(v, phase); bytes.Equal(got[:], quoted) {
				return phase, nil
			}
		}
		if !withSystemd {
			return "", mismatch("pcr %d: event log replays to %s, no boot phase extends that to the quoted %s", p, hex.EncodeToString(v[:]), hex.EncodeToString(quoted))
		}
	}
	if !withSystemd {
		return "", mismatch("pcr %d: firmware event log replays to %s, the quote holds %s", p, hex.EncodeToString(v[:]), hex.EncodeToString(quoted))
	}
	return "", mismatch("pcr %d: event logs replay to %s, the quote holds %s", p, hex.EncodeToString(v[:]), hex.EncodeToString(quoted))
}

// extractSecureBoot fills the Secure Boot state from replayed PCR 7
// events with go-eventlog's extractor, which checks every event's data
// against its digest and refuses event types unexpected in PCR 7.
func (b *Boot) extractSecureBoot(events []tcg.Event) error {
	if !has(events, pcrSecureBoot) {
		return nil
	}
	sb, err := extract.ParseSecurebootState(events, extract.TPMRegisterConfig, extract.Opts{})
	if err != nil {
		return mismatch("pcr 7: %w", err)
	}
	if len(sb.PreSeparatorAuthority) != 0 {
		return mismatch("pcr 7: %d authorities before the separator", len(sb.PreSeparatorAuthority))
	}
	b.SecureBoot = SecureBoot{
		Enabled: sb.Enabled,
		PK:      certPtrs(sb.PlatformKeys), PKHashes: sb.PlatformKeyHashes,
		KEK: certPtrs(sb.ExchangeKeys), KEKHashes: sb.ExchangeKeyHashes,
		DB: certPtrs(sb.PermittedKeys), DBHashes: sb.PermittedHashes,
		DBX: certPtrs(sb.ForbiddenKeys), DBXHashes: sb.ForbiddenHashes,
		Authorities: certPtrs(sb.PostSeparatorAuthority),
	}
	return nil
}

// structure are the PCR 4 measurements that are structure, not
// applications: what the firmware measures around boot attempts (TCG PC
// Client PFP, EV_EFI_ACTION and EV_SEPARATOR), known by digest.
var structure = uefilog.NewStructure(crypto.SHA256)

// extractApplications reads PCR 4 by digest alone: every measurement but
// the structural ones is a boot application, so relabelling an event's
// type or rewriting its data cannot hide an application from the policy.
// A boot attempt ends where the firmware measured that an application
// returned ("Returning from EFI Application from Boot Option", which EDK
// II measures before it tries the next boot option). "Calling EFI
// Application" does not start one: on QEMU's -kernel path OVMF loads (and
// measures) the image before it signals ReadyToBoot.
func (b *Boot) extractApplications(recs []record) {
	attempt := 1
	for _, r := range recs {
		switch {
		case string(r.digest[:]) == structure.Returning:
			attempt++
		case structure.Is(r.digest[:]):
		default:
			b.Applications = append(b.Applications, Application{Digest: r.digest, Attempt: attempt})
		}
	}
}

// interpretKernel reads PCR 11: systemd-stub's section pairs, then phase
// words, then the unlogged phase suffix; anything else is unexplained.
func (b *Boot) interpretKernel(recs []record, suffix string) error {
	i := 0
	for ; i < len(recs); i += 2 {
		name, ok := sectionName(recs[i])
		if !ok {
			break
		}
		if i+1 == len(recs) {
			return mismatch("pcr 11: measurement %d is a section name without contents", i+1)
		}
		if _, dup := b.Section(name); dup {
			// systemd-stub measures each section once; a second pair is
			// something else posing as a section.
			return mismatch("pcr 11: section %s measured twice (measurement %d)", name, i+1)
		}
		b.UKISections = append(b.UKISections, UKISection{Name: name, Digest: recs[i+1].digest})
	}
	var words []string
	for j := i; j < len(recs); j++ {
		if w, ok := phaseWord(recs[j]); ok {
			words = append(words, w)
			continue
		}
		b.Unexplained = append(b.Unexplained, Measurement{PCR: PCRKernel, Index: j + 1, Digest: recs[j].digest})
	}
	if suffix != "" {
		words = append(words, strings.Split(suffix, ":")...)
	}
	b.Phase, b.PhaseKnown = strings.Join(words, ":"), true
	b.PCR11AtJoin, b.PCR11AtJoinKnown = joinPoint(recs, i, suffix)
	return nil
}

// sectionName is systemd-stub's section name measurement (uefilog).
func sectionName(r record) (string, bool) {
	return uefilog.SectionName(crypto.SHA256, r.data, r.digest[:])
}

// phaseWord is a boot-phase measurement: a word whose digest is its
// content. A word with ':' is not one: the phase joins words with it.
func phaseWord(r record) (string, bool) {
	w := string(r.data)
	if w == "" || !r.verified() || strings.ContainsAny(w, ":\x00") {
		return "", false
	}
	return w, true
}

// interpretArgs reads PCR 12: the first content-verified measurement is
// the command line passed to systemd-stub (which measures the load
// options as UTF-16 with their NUL and logs the same bytes); anything
// else is unexplained.
func (b *Boot) interpretArgs(recs []record) {
	for j, r := range recs {
		if r.verified() && !b.CmdlinePassed {
			b.Cmdline, b.CmdlinePassed = strings.TrimRight(uefilog.DecodeText(r.data), "\x00"), true
			continue
		}
		b.Unexplained = append(b.Unexplained, Measurement{PCR: pcrKernelArgs, Index: j + 1, Digest: r.digest})
	}
}

func has(events []tcg.Event, pcr int) bool {
	return slices.ContainsFunc(events, func(e tcg.Event) bool { return e.Index == pcr })
}

func certPtrs(in []x509.Certificate) []*x509.Certificate {
	out := make([]*x509.Certificate, len(in))
	for i := range in {
		out[i] = &in[i]
	}
	return out
}

// UKIByLogOrder is the index in the PCR 4 applications of the last one
// the firmware log shows before systemd-stub's first PCR 11 measurement,
// or -1. The order of events across PCRs is not measured, so only the
// machine itself, reading its own log, may use it (`latchkey-agent
// measure`); the verifier never does.
func UKIByLogOrder(fwLog []byte) int {
	el, err := tcg.ParseEventLog(fwLog, tcg.ParseOpts{})
	if err != nil {
		return -1
	}
	uki, n := -1, 0
	for _, e := range el.Events(register.HashSHA256) {
		if e.Type == tcg.NoAction || len(e.Digest) != sha256.Size {
			continue
		}
		if e.Index == PCRKernel {
			return uki
		}
		if e.Index != pcrBootApps {
			continue
		}
		if !structure.Is(e.Digest) {
			uki = n
			n++
		}
	}
	return -1
}
