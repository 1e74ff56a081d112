package wire

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"
)

func TestTrimQuote(t *testing.T) {
	signed := testdata.RawQuote[:QuoteLength(testdata.RawQuote)]
	padded := append(append([]byte(nil), signed...), make([]byte, 8000-len(signed))...)
	got, err := TrimQuote(padded)
	if err != nil || !bytes.Equal(got, signed) {
		t.Fatalf("TrimQuote(zero-padded) = %d bytes, %v; want the %d signed bytes", len(got), err, len(signed))
	}
	// go-tdx-guest's quote carries text after its signed data: not padding.
	if _, err := TrimQuote(testdata.RawQuote); err == nil || !strings.Contains(err.Error(), "39 bytes after its signed data that are not zero padding") {
		t.Fatalf("TrimQuote(text appended) = %v", err)
	}
	if _, err := TrimQuote(signed[:len(signed)-1]); err == nil || !strings.Contains(err.Error(), "shorter than its signed data length says (4935)") {
		t.Fatalf("TrimQuote(truncated) = %v", err)
	}
	if _, err := TrimQuote(signed[:100]); err == nil {
		t.Fatal("TrimQuote(100 bytes) accepted")
	}
}

func TestEvidenceRoundTrip(t *testing.T) {
	signed := testdata.RawQuote[:QuoteLength(testdata.RawQuote)]
	ev, err := EncodeEvidence(Evidence{Quote: signed, CCELTable: []byte("table"), CCEL: []byte("log")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEvidence(ev)
	if err != nil || !bytes.Equal(got.Quote, signed) || string(got.CCELTable) != "table" || string(got.CCEL) != "log" {
		t.Fatalf("DecodeEvidence = %+v, %v", got, err)
	}
	if _, err := DecodeEvidence(append(ev, 0x48, 0x01)); err == nil || !strings.Contains(err.Error(), "unknown fields") {
		t.Fatalf("unknown field: %v", err)
	}
	if _, err := EncodeEvidence(Evidence{Quote: make([]byte, MaxQuoteSize+1)}); err == nil {
		t.Fatal("oversized quote encoded")
	}
	if _, err := EncodeEvidence(Evidence{Quote: signed, CCEL: []byte("log")}); err == nil || !strings.Contains(err.Error(), "both or neither") {
		t.Fatalf("log without table: %v", err)
	}
	if got := TrimCCEL([]byte{1, 2, 0xff, 0, 0xff}); !bytes.Equal(got, []byte{1, 2}) {
		t.Fatalf("TrimCCEL = %v", got)
	}
	rd, err := ReportData(bytes.Repeat([]byte{7}, 32))
	if err != nil || rd[31] != 7 || rd[32] != 0 || rd[63] != 0 {
		t.Fatalf("ReportData = %x, %v", rd, err)
	}
	if _, err := ReportData(make([]byte, 33)); err == nil {
		t.Fatal("ReportData of 33 bytes accepted")
	}
}
