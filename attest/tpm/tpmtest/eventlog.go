package tpmtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/internal/uefitest"
)

// TCG event types the synthesized logs use.
const (
	EvNoAction          = 0x03
	EvSeparator         = 0x04
	EvSCRTMVersion      = 0x08
	EvIPL               = 0x0d
	EvEFIVariableConfig = 0x80000001
	EvEFIBootApp        = 0x80000003
	EvEFIAction         = 0x80000007
	EvEFIAuthority      = 0x800000e0
)

// FirmwareLog builds a TCG2 crypto-agile firmware event log with a SHA-256
// bank only, and tracks the PCR values it replays to.
type FirmwareLog struct {
	buf  bytes.Buffer
	PCRs map[int][32]byte
	// Events counts the events after the Spec ID event.
	Events int
	// Extends are the (pcr, digest) extensions in log order, to replay
	// the log into a Simulator.
	Extends []Extension
}

// Extension is one PCR extension of a log.
type Extension struct {
	PCR    int
	Digest [32]byte
}

// Measure extends s with every extension of l, so a real quote matches
// the log.
func (l *FirmwareLog) Measure(t testing.TB, s *Simulator) {
	t.Helper()
	for _, e := range l.Extends {
		s.ExtendDigest(t, e.PCR, e.Digest)
	}
}

// NewFirmwareLog starts a log with its TCG_EfiSpecIDEvent.
func NewFirmwareLog() *FirmwareLog {
	l := &FirmwareLog{PCRs: map[int][32]byte{}}
	l.buf.Write(uefitest.SpecIDEvent(0x000b, 32))
	return l
}

// Add appends an event with an explicit digest and extends the tracked PCR.
func (l *FirmwareLog) Add(pcr int, typ uint32, data []byte, digest [32]byte) {
	binary.Write(&l.buf, binary.LittleEndian, struct{ PCR, Type, Count uint32 }{uint32(pcr), typ, 1})
	binary.Write(&l.buf, binary.LittleEndian, uint16(0x000b))
	l.buf.Write(digest[:])
	binary.Write(&l.buf, binary.LittleEndian, uint32(len(data)))
	l.buf.Write(data)
	l.Events++
	if typ != EvNoAction {
		l.Extends = append(l.Extends, Extension{pcr, digest})
		v := l.PCRs[pcr]
		l.PCRs[pcr] = sha256.Sum256(append(v[:], digest[:]...))
	}
}

// AddData appends an event whose digest is SHA-256 of its data.
func (l *FirmwareLog) AddData(pcr int, typ uint32, data []byte) {
	l.Add(pcr, typ, data, sha256.Sum256(data))
}

// Bytes is the log so far.
func (l *FirmwareLog) Bytes() []byte { return bytes.Clone(l.buf.Bytes()) }

// UTF16 encodes s as UTF-16LE with a NUL, as EFI code logs strings.
func UTF16(s string) []byte { return uefitest.UTF16(s) }

// Section is one UKI section systemd-stub measures.
type Section struct {
	Name string
	Data []byte
}

// Boot describes a synthesized OVMF boot of a UKI.
type Boot struct {
	Firmware   string
	SecureBoot bool
	// DB are DER certificates in the Secure Boot db.
	DB [][]byte
	// Loaders are Authenticode digests loaded before the UKI.
	Loaders [][32]byte
	// UKI is the UKI's Authenticode digest; Sections what its stub
	// measures into PCR 11 (none: no UKI).
	UKI      [32]byte
	Sections []Section
	// Cmdline, when Passed, is the command line a loader passed (PCR 12).
	Cmdline string
	Passed  bool
}

// OVMFLog lays out b's events in the order OVMF and systemd-stub measure
// them: PCR 0 version, PCR 7 Secure Boot variables, "Calling EFI
// Application", separators 0-7, boot applications in PCR 4, Exit Boot
// Services in PCR 5, then the stub's PCR 11 section pairs and PCR 12
// command line (the stub runs before ExitBootServices, so they come
// first; the order across PCRs does not change any PCR value).
func OVMFLog(b Boot) *FirmwareLog {
	l := NewFirmwareLog()
	l.AddData(0, EvSCRTMVersion, UTF16(b.Firmware))
	for _, v := range uefitest.SecureBootVariables(b.SecureBoot, b.DB) {
		l.AddData(7, EvEFIVariableConfig, v)
	}
	l.AddData(4, EvEFIAction, []byte("Calling EFI Application from Boot Option"))
	for pcr := range 8 {
		l.AddData(pcr, EvSeparator, []byte{0, 0, 0, 0})
	}
	if b.SecureBoot && len(b.DB) > 0 {
		// The db certificate that verified the first image (OVMF logs
		// each authority once, after the separator).
		l.AddData(7, EvEFIAuthority, uefitest.Authority(b.DB[0]))
	}
	for _, d := range b.Loaders {
		l.Add(4, EvEFIBootApp, make([]byte, 32), d)
	}
	if len(b.Sections) > 0 {
		l.Add(4, EvEFIBootApp, make([]byte, 32), b.UKI)
		l.stubSections(b.Sections)
		if b.Passed {
			l.AddData(12, EvIPL, UTF16(b.Cmdline))
		}
	}
	l.AddData(5, EvEFIAction, []byte("Exit Boot Services Invocation"))
	return l
}

// stubSections appends the stub's PCR 11 pairs: the section name (with
// its NUL) and then the contents, both described by the UTF-16 name.
func (l *FirmwareLog) stubSections(sections []Section) {
	for _, s := range sections {
		l.Add(11, EvIPL, UTF16(s.Name), sha256.Sum256(append([]byte(s.Name), 0)))
		l.Add(11, EvIPL, UTF16(s.Name), sha256.Sum256(s.Data))
	}
}

// SystemdRecord is one record of a synthesized tpm2-measure.log.
type SystemdRecord struct {
	PCR       int
	EventType string
	String    string
}

// SystemdLog encodes records as systemd writes tpm2-measure.log, each
// digest SHA-256 of the string, and extends pcrs with them.
func SystemdLog(pcrs map[int][32]byte, records ...SystemdRecord) []byte {
	var b bytes.Buffer
	for _, r := range records {
		d := sha256.Sum256([]byte(r.String))
		fmt.Fprintf(&b, "\x1e{\"pcr\":%d,\"digests\":[{\"hashAlg\":\"sha256\",\"digest\":\"%s\"}],\"content_type\":\"systemd\",\"content\":{\"string\":%q,\"eventType\":%q}}\n",
			r.PCR, hex.EncodeToString(d[:]), r.String, r.EventType)
		v := pcrs[r.PCR]
		pcrs[r.PCR] = sha256.Sum256(append(v[:], d[:]...))
	}
	return b.Bytes()
}

// ExtendPhase extends PCR 11 of pcrs with each word of phase, unlogged,
// as systemd 252's systemd-pcrphase does.
func ExtendPhase(pcrs map[int][32]byte, phase string) {
	if phase == "" {
		return
	}
	for _, w := range strings.Split(phase, ":") {
		d := sha256.Sum256([]byte(w))
		v := pcrs[11]
		pcrs[11] = sha256.Sum256(append(v[:], d[:]...))
	}
}

// Indices are the PCRs of pcrs in ascending order.
func Indices(pcrs map[int][32]byte) []int { return slices.Sorted(maps.Keys(pcrs)) }

// ExtendDigest extends SHA-256 PCR pcr with digest as it is, the way a
// firmware measurement with a precomputed digest (an Authenticode hash)
// does.
func (s *Simulator) ExtendDigest(t testing.TB, pcr int, digest [32]byte) {
	t.Helper()
	s.withTPM(t, func(tp transport.TPM) error {
		_, err := tpm2.PCRExtend{
			PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(pcr), Auth: tpm2.PasswordAuth(nil)},
			Digests: tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{
				{HashAlg: tpm2.TPMAlgSHA256, Digest: digest[:]},
			}},
		}.Execute(tp)
		return err
	})
}
