// Package wire is the encoding both halves of the Intel TDX variant share:
// the TDXEvidence message the agent sends and the verifier decodes, and the
// REPORTDATA layout that carries the session binding. It is a leaf (no
// go-tdx-guest verification code, no device code), so the agent's issuer
// and the verifier's validator each link only their own half.
package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

const (
	// MaxQuoteSize bounds a raw TD quote. A version 4 quote with its PCK
	// certificate chain (three PEM certificates) is about 5 KiB; 8 KiB
	// quotes are seen where the QE adds padding.
	MaxQuoteSize = 16 << 10
	// MaxCCELTableSize bounds the ACPI CCEL table (56 bytes in ACPI 6.5).
	MaxCCELTableSize = 1 << 10
	// MaxCCELSize bounds the CC event log without its padding; firmware
	// reserves 64 to 256 KiB for it and a boot through a boot loader and
	// kernel fills some 20 KiB.
	MaxCCELSize = 192 << 10
	// MaxEvidenceSize bounds a serialized TDXEvidence message.
	MaxEvidenceSize = MaxQuoteSize + MaxCCELTableSize + MaxCCELSize + 64
	// ReportDataSize is the size of a TD report's REPORTDATA.
	ReportDataSize = 64
)

var _ [attest.MaxEvidenceSize - MaxEvidenceSize]struct{}

// ReportData is the REPORTDATA a TD quote carries for binding: the
// attest.BindingSize-byte session binding followed by zeros, as in the
// first half of an SNP REPORT_DATA.
func ReportData(binding []byte) ([ReportDataSize]byte, error) {
	var rd [ReportDataSize]byte
	if len(binding) != attest.BindingSize {
		return rd, fmt.Errorf("binding is %d bytes, want %d", len(binding), attest.BindingSize)
	}
	copy(rd[:], binding)
	return rd, nil
}

// Evidence is a decoded TDXEvidence message.
type Evidence struct {
	// Quote is the raw TD quote.
	Quote []byte
	// CCELTable and CCEL are the ACPI CCEL table and the CC event log;
	// both nil when the agent sent none.
	CCELTable, CCEL []byte
}

// EncodeEvidence wraps ev in a TDXEvidence message.
func EncodeEvidence(ev Evidence) ([]byte, error) {
	if err := ev.check(); err != nil {
		return nil, err
	}
	b, err := proto.Marshal(&latchkeyv1.TDXEvidence{Quote: ev.Quote, CcelTable: ev.CCELTable, CcelData: ev.CCEL})
	if err != nil {
		return nil, fmt.Errorf("marshal tdx evidence: %w", err)
	}
	return b, nil
}

func (ev Evidence) check() error {
	switch {
	case len(ev.Quote) == 0 || len(ev.Quote) > MaxQuoteSize:
		return fmt.Errorf("tdx quote of %d bytes (want 1 to %d)", len(ev.Quote), MaxQuoteSize)
	case (len(ev.CCELTable) == 0) != (len(ev.CCEL) == 0):
		return fmt.Errorf("tdx evidence has a CCEL table of %d bytes and an event log of %d: both or neither", len(ev.CCELTable), len(ev.CCEL))
	case len(ev.CCELTable) > MaxCCELTableSize || len(ev.CCEL) > MaxCCELSize:
		return fmt.Errorf("tdx CCEL table of %d bytes or event log of %d exceeds %d or %d", len(ev.CCELTable), len(ev.CCEL), MaxCCELTableSize, MaxCCELSize)
	}
	return nil
}

// DecodeEvidence decodes a TDXEvidence message: at most MaxEvidenceSize
// bytes, no unknown fields, a quote of 1 to MaxQuoteSize bytes, and a CCEL
// table and event log both present (within their bounds) or both absent.
// It does not parse the quote or the log.
func DecodeEvidence(evidence []byte) (*Evidence, error) {
	if len(evidence) > MaxEvidenceSize {
		return nil, fmt.Errorf("evidence of %d bytes exceeds %d", len(evidence), MaxEvidenceSize)
	}
	var m latchkeyv1.TDXEvidence
	if err := proto.Unmarshal(evidence, &m); err != nil {
		return nil, fmt.Errorf("decode tdx evidence: %w", err)
	}
	if len(m.ProtoReflect().GetUnknown()) != 0 {
		return nil, fmt.Errorf("tdx evidence has unknown fields")
	}
	ev := Evidence{Quote: m.GetQuote(), CCELTable: m.GetCcelTable(), CCEL: m.GetCcelData()}
	if err := ev.check(); err != nil {
		return nil, err
	}
	return &ev, nil
}

// TrimCCEL cuts the padding (0xFF or 0x00 bytes) the firmware leaves after
// the last event of the region it reserved for the CC event log.
func TrimCCEL(data []byte) []byte {
	n := len(data)
	for n > 0 && (data[n-1] == 0xff || data[n-1] == 0) {
		n--
	}
	return data[:n]
}

// Layout of a version 4 quote: a 48-byte header, the 584-byte TD quote
// body, then the signed data's length (uint32, little-endian) and the
// signed data.
const signedDataAt = 48 + 584 + 4

// QuoteLength is the length a quote's signed data length field implies,
// -1 when raw is too short to hold the field. The validator refuses any
// byte after it.
func QuoteLength(raw []byte) int {
	if len(raw) < signedDataAt {
		return -1
	}
	return signedDataAt + SignedDataLength(raw)
}

// SignedDataLength is the signed data length a quote's field states, -1
// when raw is too short to hold the field.
func SignedDataLength(raw []byte) int {
	if len(raw) < signedDataAt {
		return -1
	}
	return int(binary.LittleEndian.Uint32(raw[signedDataAt-4 : signedDataAt]))
}

// TrimQuote cuts the zero padding the kernel's quote buffer leaves after a
// quote's signed data (a configfs-tsm or TDX guest device quote comes in
// a fixed-size buffer). Anything but zeros after the signed data, or a
// quote shorter than its length field says, is an error.
func TrimQuote(raw []byte) ([]byte, error) {
	n := QuoteLength(raw)
	if n < 0 || n > len(raw) {
		return nil, fmt.Errorf("tdx quote of %d bytes is shorter than its signed data length says (%d)", len(raw), n)
	}
	if len(bytes.Trim(raw[n:], "\x00")) != 0 {
		return nil, fmt.Errorf("tdx quote has %d bytes after its signed data that are not zero padding", len(raw)-n)
	}
	return raw[:n], nil
}
