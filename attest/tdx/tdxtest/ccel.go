package tdxtest

import (
	"bytes"
	"crypto/sha512"
	"encoding/binary"

	"github.com/latchkey/latchkey/internal/uefitest"
)

// TCG event types the synthesized CC event logs use.
const (
	EvNoAction          = 0x03
	EvSeparator         = 0x04
	EvIPL               = 0x0d
	EvEFIVariableConfig = 0x80000001
	EvEFIBootApp        = 0x80000003
	EvEFIAction         = 0x80000007
	EvEFIGPT            = 0x80000006
	EvEFIAuthority      = 0x800000e0
)

// CCEL builds a TDX CC event log (TCG crypto-agile, SHA-384 only, each
// event naming its CC MR index: 1 is RTMR[0]) and tracks the RTMR values
// it replays to.
type CCEL struct {
	buf   bytes.Buffer
	RTMRs [4][48]byte
}

// NewCCEL starts a log with its TCG_EfiSpecIDEvent.
func NewCCEL() *CCEL {
	l := &CCEL{}
	l.buf.Write(uefitest.SpecIDEvent(0x000c, 48))
	return l
}

// Add appends an event to RTMR[rtmr] with an explicit digest.
func (l *CCEL) Add(rtmr int, typ uint32, data []byte, digest [48]byte) {
	binary.Write(&l.buf, binary.LittleEndian, struct{ MR, Type, Count uint32 }{uint32(rtmr + 1), typ, 1})
	binary.Write(&l.buf, binary.LittleEndian, uint16(0x000c))
	l.buf.Write(digest[:])
	binary.Write(&l.buf, binary.LittleEndian, uint32(len(data)))
	l.buf.Write(data)
	l.RTMRs[rtmr] = sha512.Sum384(append(l.RTMRs[rtmr][:], digest[:]...))
}

// AddData appends an event whose digest is SHA-384 of its data.
func (l *CCEL) AddData(rtmr int, typ uint32, data []byte) {
	l.Add(rtmr, typ, data, sha512.Sum384(data))
}

// Bytes is the log so far.
func (l *CCEL) Bytes() []byte { return bytes.Clone(l.buf.Bytes()) }

// RTMRSlices are the tracked RTMRs as a quote body holds them.
func (l *CCEL) RTMRSlices() [][]byte {
	out := make([][]byte, 4)
	for i := range l.RTMRs {
		out[i] = bytes.Clone(l.RTMRs[i][:])
	}
	return out
}

// CCELTable is an ACPI CCEL table naming a TDX log (56 bytes).
func CCELTable() []byte {
	t := make([]byte, 56)
	copy(t, "CCEL")
	binary.LittleEndian.PutUint32(t[4:], 56)
	t[36] = 2 // CC type: TDX
	binary.LittleEndian.PutUint64(t[40:], 64<<10)
	return t
}

// UTF16 encodes s as UTF-16LE with a NUL, as EFI code logs strings.
func UTF16(s string) []byte { return uefitest.UTF16(s) }

// Section is one UKI section systemd-stub measures.
type Section struct {
	Name string
	Data []byte
}

// UKIBoot describes a synthesized TDVF boot of a UKI.
type UKIBoot struct {
	SecureBoot bool
	// DB are DER certificates in the Secure Boot db (also PK and KEK).
	DB [][]byte
	// Loaders are Authenticode SHA-384 digests loaded before the UKI.
	Loaders [][48]byte
	// UKI is the UKI's Authenticode SHA-384 digest; Sections what its
	// stub measures (PCR 11, RTMR[2]); none: no UKI.
	UKI      [48]byte
	Sections []Section
	// Cmdline, when Passed, is the command line a loader passed (PCR 12,
	// RTMR[2]).
	Cmdline string
	Passed  bool
	// Extra are RTMR[2] measurements after the stub's (the kernel's
	// initrd measurement), logged as "Linux initrd".
	Extra [][48]byte
	// GPT is the UEFI_GPT_DATA the firmware measures (PCR 5, RTMR[1]);
	// nil measures none.
	GPT []byte
	// Edit, when set, rewrites each event before it is logged (an
	// attacker editing the log); the log's RTMRs follow the edit.
	Edit func(rtmr int, typ uint32, data []byte, digest [48]byte) (uint32, []byte, [48]byte)
}

// TDVFLog lays out b's events in the order TDVF and systemd-stub
// measure them (RTMR[0]: PCR 1 and 7; RTMR[1]: PCR 2-6; RTMR[2]: PCR
// 8-15): the Secure Boot variables and separator, "Calling EFI
// Application", the separators and GPT, the applications, the stub's
// section pairs and passed command line, then Exit Boot Services.
func TDVFLog(b UKIBoot) *CCEL {
	l := &editing{CCEL: NewCCEL(), edit: b.Edit}
	for _, v := range uefitest.SecureBootVariables(b.SecureBoot, b.DB) {
		l.AddData(0, EvEFIVariableConfig, v)
	}
	l.AddData(0, EvSeparator, []byte{0, 0, 0, 0})
	l.AddData(1, EvEFIAction, []byte("Calling EFI Application from Boot Option"))
	l.AddData(1, EvSeparator, []byte{0, 0, 0, 0})
	if b.SecureBoot && len(b.DB) > 0 {
		// The db certificate that verified the first image (logged once,
		// after the separator).
		l.AddData(0, EvEFIAuthority, uefitest.Authority(b.DB[0]))
	}
	if b.GPT != nil {
		l.AddData(1, EvEFIGPT, b.GPT)
	}
	for _, d := range b.Loaders {
		l.Add(1, EvEFIBootApp, make([]byte, 32), d)
	}
	if len(b.Sections) > 0 {
		l.Add(1, EvEFIBootApp, make([]byte, 32), b.UKI)
		for _, s := range b.Sections {
			l.Add(2, EvIPL, UTF16(s.Name), sha512.Sum384(append([]byte(s.Name), 0)))
			l.Add(2, EvIPL, UTF16(s.Name), sha512.Sum384(s.Data))
		}
		if b.Passed {
			l.AddData(2, EvIPL, UTF16(b.Cmdline))
		}
	}
	for _, d := range b.Extra {
		l.Add(2, EvIPL, []byte("Linux initrd"), d)
	}
	l.AddData(1, EvEFIAction, []byte("Exit Boot Services Invocation"))
	l.AddData(1, EvEFIAction, []byte("Exit Boot Services Returned with Success"))
	return l.CCEL
}

// editing routes a log's events through an Edit function.
type editing struct {
	*CCEL
	edit func(int, uint32, []byte, [48]byte) (uint32, []byte, [48]byte)
}

func (l *editing) Add(rtmr int, typ uint32, data []byte, digest [48]byte) {
	if l.edit != nil {
		typ, data, digest = l.edit(rtmr, typ, data, digest)
	}
	l.CCEL.Add(rtmr, typ, data, digest)
}

func (l *editing) AddData(rtmr int, typ uint32, data []byte) {
	l.Add(rtmr, typ, data, sha512.Sum384(data))
}
