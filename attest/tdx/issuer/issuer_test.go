package issuer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
)

// fakeProvider is a client.QuoteProvider that answers with quote, its
// REPORTDATA set to the request when setReportData, in an 8000-byte
// zero-padded buffer as the kernel returns it. The issuer does not verify
// signatures, so the edited quote serves its unit tests.
type fakeProvider struct {
	setReportData bool
	err           error
}

const offReportData = 568

func (p *fakeProvider) IsSupported() error { return nil }

func (p *fakeProvider) GetRawQuote(rd [64]byte) ([]uint8, error) {
	if p.err != nil {
		return nil, p.err
	}
	q := testdata.RawQuote[:wire.QuoteLength(testdata.RawQuote)]
	buf := make([]byte, 8000)
	copy(buf, q)
	if p.setReportData {
		copy(buf[offReportData:], rd[:])
	}
	return buf, nil
}

// noCCEL points the issuer at event log files that do not exist, so the
// tests do not depend on the machine they run on.
func noCCEL(t *testing.T, c Config) Config {
	c.CCELTable, c.CCELData = filepath.Join(t.TempDir(), "CCEL"), filepath.Join(t.TempDir(), "data-CCEL")
	return c
}

func TestAttest(t *testing.T) {
	iss, err := New(noCCEL(t, Config{QuoteProvider: &fakeProvider{setReportData: true}}))
	if err != nil {
		t.Fatal(err)
	}
	binding := bytes.Repeat([]byte{0x5a}, attest.BindingSize)
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := wire.DecodeEvidence(a.Evidence())
	if err != nil {
		t.Fatal(err)
	}
	q := ev.Quote
	if ev.CCEL != nil {
		t.Error("event log sent where none was configured")
	}
	if len(q) != 4935 {
		t.Errorf("quote of %d bytes, want the 4935 signed bytes without padding", len(q))
	}
	rd := q[offReportData : offReportData+64]
	if !bytes.Equal(rd[:32], binding) || !bytes.Equal(rd[32:], make([]byte, 32)) {
		t.Errorf("REPORTDATA %x is not the binding and zeros", rd)
	}
	if _, err := a.Respond(context.Background(), []byte("x")); err == nil || !strings.Contains(err.Error(), "takes no challenge") {
		t.Errorf("Respond = %v", err)
	}
}

func TestAttestRefusesOtherQuote(t *testing.T) {
	iss, _ := New(noCCEL(t, Config{QuoteProvider: &fakeProvider{}}))
	_, err := iss.Attest(context.Background(), make([]byte, attest.BindingSize))
	if err == nil || err.Error() != "tdx: quote does not carry the requested REPORTDATA" {
		t.Fatalf("Attest = %v", err)
	}
}

func TestAttestDeviceFailure(t *testing.T) {
	iss, _ := New(noCCEL(t, Config{QuoteProvider: &fakeProvider{err: errors.New("EBUSY")}}))
	_, err := iss.Attest(context.Background(), make([]byte, attest.BindingSize))
	if !errors.Is(err, attest.ErrDevice) || !strings.Contains(err.Error(), "get quote: EBUSY") {
		t.Fatalf("Attest = %v, want a device failure", err)
	}
	if _, err := iss.Attest(context.Background(), make([]byte, 31)); err == nil || !strings.Contains(err.Error(), "binding is 31 bytes") {
		t.Fatalf("short binding: %v", err)
	}
}

// TestMeasure reads the values of go-tdx-guest's real quote: the snippet
// names exactly what the verifier's validator decodes from it.
func TestMeasure(t *testing.T) {
	v, err := Measure(noCCEL(t, Config{QuoteProvider: &fakeProvider{setReportData: true}}))
	if err != nil {
		t.Fatal(err)
	}
	if v.MRTDs[0] != "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb" ||
		len(v.RTMRs) != 4 || v.RTMRs[3][0] != strings.Repeat("0", 96) || v.XFAMs[0] != "e71a060000000000" ||
		v.Attributes[0] != "0000004000000000" || v.MinimumTeeTcbSvn != "03000400000000000000000000000000" || v.MRConfigIDs != nil {
		t.Fatalf("Measure = %+v", v)
	}
}

// TestAttestSendsCCEL: the firmware's CC event log goes with the quote,
// its padding cut.
func TestAttestSendsCCEL(t *testing.T) {
	dir := t.TempDir()
	table, data := filepath.Join(dir, "CCEL"), filepath.Join(dir, "data-CCEL")
	log := append([]byte("events"), bytes.Repeat([]byte{0xff}, 4096)...)
	if err := os.WriteFile(table, []byte("CCEL table"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, log, 0o644); err != nil {
		t.Fatal(err)
	}
	iss, err := New(Config{QuoteProvider: &fakeProvider{setReportData: true}, CCELTable: table, CCELData: data})
	if err != nil {
		t.Fatal(err)
	}
	a, err := iss.Attest(context.Background(), make([]byte, attest.BindingSize))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := wire.DecodeEvidence(a.Evidence())
	if err != nil || string(ev.CCELTable) != "CCEL table" || string(ev.CCEL) != "events" {
		t.Fatalf("evidence %+v, %v", ev, err)
	}
	if err := os.WriteFile(data, bytes.Repeat([]byte{0xff}, 64), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := iss.Attest(context.Background(), make([]byte, attest.BindingSize)); err == nil || !strings.Contains(err.Error(), "CC event log of 0 bytes") {
		t.Fatalf("empty log: %v", err)
	}
}
