package tdx

import (
	"time"

	"github.com/latchkey/latchkey/attest/tdx/wire"
)

// WithClock sets the clock certificates and collateral are checked against
// (default time.Now): the tests' way to verify at a fixed time.
func WithClock(now func() time.Time) ValidatorOption { return func(v *Validator) { v.now = now } }

// WithReportData makes the binding check expect rd whatever the binding:
// the tests' way to verify a quote taken elsewhere against its own
// REPORTDATA.
func WithReportData(rd [wire.ReportDataSize]byte) ValidatorOption {
	return func(v *Validator) {
		v.reportData = func([]byte) ([wire.ReportDataSize]byte, error) { return rd, nil }
	}
}
