package tpm

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf16"

	"github.com/google/go-eventlog/extract"
	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// PCRs systemd-stub and systemd measure into (systemd's TPM2 PCR
// assignments).
const (
	pcrBootApps   = 4  // EFI boot applications (firmware)
	pcrSecureBoot = 7  // Secure Boot state (firmware)
	pcrKernel     = 11 // UKI sections (systemd-stub) and boot phases
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

// VerifyBoot replays a firmware and a systemd event log against PCR
// values and returns what they verifiably say; it is Verify's step 6 and
// what `latchkey-agent measure` runs on the machine's own PCRs. Every
// failure is an *attest.Refusal (see verifyBoot for the checks).
func VerifyBoot(pcrs map[int][sha256.Size]byte, firmwareLog, systemdLog []byte) (*Boot, error) {
	raw := make(map[int][]byte, len(pcrs))
	for p, v := range pcrs {
		raw[p] = v[:]
	}
	return verifyBoot(raw, firmwareLog, systemdLog)
}

// verifyBoot replays the event logs against the quoted PCRs and returns
// what they verifiably say. Its checks, in order:
//
//  1. Decoding (MALFORMED): the firmware log is a TCG2 crypto-agile log
//     with SHA-256 digests (go-eventlog's parser) of at most
//     MaxFirmwareLogSize bytes and maxFirmwareEvents events; the systemd
//     log decodes (decodeSystemdLog).
//  2. Coverage (EVENT_LOG_MISMATCH): every PCR either log extends must be
//     quoted, so no measurement escapes the replay.
//  3. Replay (EVENT_LOG_MISMATCH): every PCR only the firmware log
//     touches must replay to its quoted value with go-eventlog's replay
//     (and its workarounds for known firmware bugs); every PCR both logs
//     touch must replay firmware events then systemd events to it; PCR 11
//     without systemd events may be followed by a prefix of
//     StandardPhases, unlogged (systemd 252), which names the phase. The
//     refusal names the PCR, the replayed and the quoted value.
//  4. Structure (EVENT_LOG_MISMATCH): go-eventlog's extraction of the
//     Secure Boot state (PCR 7: variables before the separator, digests
//     matching data, no debugger) and of the boot applications (PCR 4
//     and 5: applications after "Calling EFI Application", up to
//     ExitBootServices); systemd-stub's PCR 11 events must pair a section
//     name (its digest the name's) with its contents, each name once.
//
// The returned Boot holds only values of events that replayed.
func verifyBoot(pcrs map[int][]byte, fwLog, sdLog []byte) (b *Boot, err error) {
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
	sdByPCR := map[int][]sdEvent{}
	for _, e := range sd {
		sdByPCR[e.pcr] = append(sdByPCR[e.pcr], e)
	}
	touched := slices.Sorted(maps.Keys(byPCR))
	for p := range sdByPCR {
		if !slices.Contains(touched, p) {
			touched = append(touched, p)
		}
	}
	slices.Sort(touched)
	for _, p := range touched {
		if _, ok := pcrs[p]; !ok {
			return nil, mismatch("event log extends pcr %d, which the quote does not cover", p)
		}
	}
	b = &Boot{}
	var fwOnly []register.MR
	var joint []int
	for _, p := range touched {
		if _, both := sdByPCR[p]; both || p == pcrKernel {
			joint = append(joint, p)
			continue
		}
		fwOnly = append(fwOnly, register.PCR{Index: p, Digest: pcrs[p], DigestAlg: crypto.SHA256})
	}
	// Firmware-only PCRs first: they are the lower ones (0-7), so the
	// refusal names the earliest component that differs.
	events, err := el.Verify(fwOnly)
	if err != nil {
		return nil, replayRefusal(fwOnly, byPCR)
	}
	for _, p := range joint {
		if err := replayJoint(b, p, pcrs[p], byPCR[p], sdByPCR[p]); err != nil {
			return nil, err
		}
	}
	if err := b.extractFirmware(events); err != nil {
		return nil, err
	}
	if err := b.extractStub(byPCR[pcrKernel], byPCR[pcrKernelArgs], events); err != nil {
		return nil, err
	}
	b.addSystemd(sd)
	return b, nil
}

func decodeLogs(fwLog, sdLog []byte) (*tcg.EventLog, []tcg.Event, []sdEvent, error) {
	if len(fwLog) > MaxFirmwareLogSize {
		return nil, nil, nil, fmt.Errorf("firmware event log has %d bytes, limit %d", len(fwLog), MaxFirmwareLogSize)
	}
	el, err := tcg.ParseEventLog(fwLog, tcg.ParseOpts{})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("firmware event log: %w", err)
	}
	if !slices.Contains(el.Algs, register.HashSHA256) {
		return nil, nil, nil, errors.New("firmware event log has no sha256 digests")
	}
	raw := el.Events(register.HashSHA256)
	if len(raw) > maxFirmwareEvents {
		return nil, nil, nil, fmt.Errorf("firmware event log has %d events, limit %d", len(raw), maxFirmwareEvents)
	}
	for i, e := range raw {
		if e.Type != tcg.NoAction && len(e.Digest) != sha256.Size {
			return nil, nil, nil, fmt.Errorf("firmware event log event %d (pcr %d) has no sha256 digest", i, e.Index)
		}
		if e.Index < 0 || e.Index > maxPCR {
			return nil, nil, nil, fmt.Errorf("firmware event log event %d names pcr %d", i, e.Index)
		}
	}
	var sd []sdEvent
	if len(sdLog) > 0 {
		if sd, err = decodeSystemdLog(sdLog); err != nil {
			return nil, nil, nil, err
		}
	}
	return el, raw, sd, nil
}

// seqEvent is an unverified firmware event with its place in the log
// (EventLog.Events leaves Num unset; Verify numbers events from 1 after
// the Spec ID event, and so does this).
type seqEvent struct {
	tcg.Event
	seq uint32
}

// groupByPCR drops EV_NO_ACTION events, which extend nothing.
func groupByPCR(raw []tcg.Event) map[int][]seqEvent {
	out := map[int][]seqEvent{}
	for i, e := range raw {
		if e.Type == tcg.NoAction {
			continue
		}
		out[e.Index] = append(out[e.Index], seqEvent{e, uint32(i + 1)})
	}
	return out
}

// replayFirmware folds firmware events the way TPM2_PCR_Extend does,
// from zero (the PCRs replayed here are never reset by an H-CRTM).
func replayFirmware(events []seqEvent) [sha256.Size]byte {
	var v [sha256.Size]byte
	for _, e := range events {
		v = Extend(v, [sha256.Size]byte(e.Digest))
	}
	return v
}

// replayRefusal names the lowest PCR whose firmware replay fails. PCR 0
// may start from a locality or H-CRTM value go-eventlog knows about; when
// the plain fold happens to match, the detail says so rather than guess.
func replayRefusal(mrs []register.MR, byPCR map[int][]seqEvent) error {
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

// replayJoint replays a PCR that systemd extends after the firmware (and
// PCR 11, whose phase words systemd 252 extends unlogged).
func replayJoint(b *Boot, p int, quoted []byte, fw []seqEvent, sd []sdEvent) error {
	v := replayFirmware(fw)
	for _, e := range sd {
		v = Extend(v, e.digest)
	}
	if bytes.Equal(v[:], quoted) {
		if p == pcrKernel {
			b.Phase, b.PhaseKnown = sdPhase(sd), true
		}
		return nil
	}
	if p == pcrKernel && len(sd) == 0 {
		for _, phase := range candidatePhases() {
			if got := ExtendPhase(v, phase); bytes.Equal(got[:], quoted) {
				b.Phase, b.PhaseKnown = phase, true
				return nil
			}
		}
		return mismatch("pcr %d: event log replays to %s, no boot phase extends that to the quoted %s", p, hex.EncodeToString(v[:]), hex.EncodeToString(quoted))
	}
	return mismatch("pcr %d: event logs replay to %s, the quote holds %s", p, hex.EncodeToString(v[:]), hex.EncodeToString(quoted))
}

// sdPhase joins the phase words systemd logged for PCR 11.
func sdPhase(sd []sdEvent) string {
	var words []string
	for _, e := range sd {
		if e.typ == "phase" {
			words = append(words, e.content)
		}
	}
	return strings.Join(words, ":")
}

// extractFirmware fills the firmware, Secure Boot and boot-application
// fields from replayed events with go-eventlog's extractors.
func (b *Boot) extractFirmware(events []tcg.Event) error {
	if has(events, pcrSecureBoot) {
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
	}
	if has(events, 0) {
		ps, err := extract.PlatformState(crypto.SHA256, events)
		if err != nil {
			return mismatch("pcr 0: %w", err)
		}
		b.Firmware = strings.TrimRight(decodeText(ps.GetScrtmVersionId()), "\x00")
		for _, e := range events {
			if e.Index == 0 && (e.Type == tcg.EFIPlatformFirmwareBlob || e.Type == tcg.EFIPlatformFirmwareBlob2) {
				b.FirmwareBlobs = append(b.FirmwareBlobs, [sha256.Size]byte(e.Digest))
			}
		}
	}
	if has(events, pcrBootApps) {
		efi, err := extract.EfiState(crypto.SHA256, events, extract.TPMRegisterConfig, extract.Opts{})
		if err != nil {
			return mismatch("pcr 4: %w", err)
		}
		for _, app := range efi.GetApps() {
			if len(app.Digest) != sha256.Size {
				return mismatch("pcr 4: boot application digest has %d bytes", len(app.Digest))
			}
			b.Applications = append(b.Applications, Application{Digest: [sha256.Size]byte(app.Digest), Role: RoleBootLoader})
		}
	}
	return nil
}

// extractStub reads systemd-stub's measurements: section name and
// contents pairs in PCR 11, the passed command line and other stub events
// in PCR 12. PCR 11 events have been replayed by replayJoint, PCR 12
// events by either replay. It then marks the UKI among the applications:
// the last one loaded before the first PCR 11 event.
func (b *Boot) extractStub(kernel, args []seqEvent, replayed []tcg.Event) error {
	for i := 0; i < len(kernel); i += 2 {
		if i+1 == len(kernel) {
			return mismatch("pcr 11: event %d is a section name without contents", kernel[i].seq)
		}
		name := strings.TrimSuffix(decodeText(kernel[i].Data), "\x00")
		if want := sha256.Sum256(append([]byte(name), 0)); !bytes.Equal(kernel[i].Digest, want[:]) {
			return mismatch("pcr 11: event %d is not a systemd-stub section name measurement", kernel[i].seq)
		}
		if _, dup := b.Section(name); dup {
			// systemd-stub measures each section once; a second pair is
			// something else posing as a section.
			return mismatch("pcr 11: section %s measured twice (event %d)", name, kernel[i].seq)
		}
		b.UKISections = append(b.UKISections, UKISection{Name: name, Digest: [sha256.Size]byte(kernel[i+1].Digest)})
	}
	for _, e := range args {
		text := decodeText(e.Data)
		digest := [sha256.Size]byte(e.Digest)
		if sum := sha256.Sum256(e.Data); bytes.Equal(sum[:], e.Digest) && !b.CmdlinePassed {
			// systemd-stub measures the load options as UTF-16 with
			// their NUL and logs the same bytes.
			b.Cmdline, b.CmdlinePassed = strings.TrimRight(text, "\x00"), true
			continue
		}
		b.Systemd = append(b.Systemd, SystemdEvent{PCR: pcrKernelArgs, Type: "stub", Content: strings.TrimRight(text, "\x00"), Digest: digest})
	}
	b.markUKI(kernel, replayed)
	return nil
}

func (b *Boot) markUKI(kernel []seqEvent, replayed []tcg.Event) {
	if len(kernel) == 0 || len(b.Applications) == 0 {
		return
	}
	first := kernel[0].seq
	uki := -1
	n := 0
	for _, e := range replayed {
		if e.Index != pcrBootApps || e.Type != tcg.EFIBootServicesApplication {
			continue
		}
		if n < len(b.Applications) && e.Num() < first {
			uki = n
		}
		n++
	}
	if uki < 0 {
		return
	}
	b.Applications[uki].Role = RoleUKI
	for i := uki + 1; i < len(b.Applications); i++ {
		b.Applications[i].Role = RoleUKIPayload
	}
}

// addSystemd records the userspace log; phase, machine-id and other
// string events are marked verified when the digest is the string's.
func (b *Boot) addSystemd(sd []sdEvent) {
	for _, e := range sd {
		sum := sha256.Sum256([]byte(e.content))
		b.Systemd = append(b.Systemd, SystemdEvent{
			PCR: e.pcr, Type: e.typ, Content: e.content,
			ContentVerified: sum == e.digest, Digest: e.digest,
		})
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

// decodeText reads event data that is UTF-16LE (what EFI code logs) when
// it looks like it, else bytes as they are.
func decodeText(b []byte) string {
	if len(b) >= 2 && len(b)%2 == 0 && b[1] == 0 {
		u := make([]uint16, len(b)/2)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
		return string(utf16.Decode(u))
	}
	return string(b)
}
