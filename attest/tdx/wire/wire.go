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
	// MaxEvidenceSize bounds a serialized TDXEvidence message.
	MaxEvidenceSize = MaxQuoteSize + 64
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

// EncodeEvidence wraps a raw quote in a TDXEvidence message.
func EncodeEvidence(quote []byte) ([]byte, error) {
	if len(quote) == 0 || len(quote) > MaxQuoteSize {
		return nil, fmt.Errorf("tdx quote of %d bytes (want 1 to %d)", len(quote), MaxQuoteSize)
	}
	b, err := proto.Marshal(&latchkeyv1.TDXEvidence{Quote: quote})
	if err != nil {
		return nil, fmt.Errorf("marshal tdx evidence: %w", err)
	}
	return b, nil
}

// DecodeEvidence returns the raw quote of a TDXEvidence message: at most
// MaxEvidenceSize bytes, no unknown fields, a quote of 1 to MaxQuoteSize
// bytes. It does not parse the quote.
func DecodeEvidence(evidence []byte) ([]byte, error) {
	if len(evidence) > MaxEvidenceSize {
		return nil, fmt.Errorf("evidence of %d bytes exceeds %d", len(evidence), MaxEvidenceSize)
	}
	var ev latchkeyv1.TDXEvidence
	if err := proto.Unmarshal(evidence, &ev); err != nil {
		return nil, fmt.Errorf("decode tdx evidence: %w", err)
	}
	if len(ev.ProtoReflect().GetUnknown()) != 0 {
		return nil, fmt.Errorf("tdx evidence has unknown fields")
	}
	q := ev.GetQuote()
	if len(q) == 0 || len(q) > MaxQuoteSize {
		return nil, fmt.Errorf("tdx quote of %d bytes (want 1 to %d)", len(q), MaxQuoteSize)
	}
	return q, nil
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
	return signedDataAt + int(binary.LittleEndian.Uint32(raw[signedDataAt-4:signedDataAt]))
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
