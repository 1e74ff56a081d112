// Package issuer is the agent side of latchkey's Intel TDX evidence
// variant: it asks the TDX module, through the kernel, for a TD quote
// whose REPORTDATA carries the session binding, and sends it as
// TDXEvidence. It uses the kernel's configfs-tsm report interface where
// present and the TDX guest device (/dev/tdx_guest) otherwise, both
// through go-tdx-guest's client. It links no verification code: the
// verifier side is attest/tdx.
package issuer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/client"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// guestDevice is the TDX guest device of kernels without configfs-tsm.
const guestDevice = "/dev/tdx_guest"

// Where Linux exposes the firmware's CC event log: the ACPI CCEL table and
// the log region it points at.
const (
	DefaultCCELTable = "/sys/firmware/acpi/tables/CCEL"
	DefaultCCELData  = "/sys/firmware/acpi/tables/data/CCEL"
)

// Config configures New.
type Config struct {
	// QuoteProvider gets quotes: a go-tdx-guest client.QuoteProvider or
	// client.Device. nil selects the platform's: configfs-tsm when the
	// kernel offers it with the tdx_guest provider, else the TDX guest
	// device. Tests inject a fake.
	QuoteProvider any
	// CCELTable and CCELData are the CC event log files sent with each
	// quote ("" for DefaultCCELTable and DefaultCCELData). When either is
	// missing the quote goes alone; the verifier's policy decides whether
	// that is enough.
	CCELTable, CCELData string
	// Logger receives one line per quote (default slog.Default()).
	Logger *slog.Logger
}

// Issuer produces TDX evidence on the agent. It implements attest.Issuer.
type Issuer struct {
	qp                  any
	ccelTable, ccelData string
	log                 *slog.Logger
}

var _ attest.Issuer = (*Issuer)(nil)

// New returns an issuer over cfg's quote provider, failing when the
// machine offers no TDX guest interface.
func New(cfg Config) (*Issuer, error) {
	qp := cfg.QuoteProvider
	if qp == nil {
		if !Available() {
			return nil, errors.New("tdx: neither configfs-tsm with the tdx_guest provider nor " + guestDevice + " is present")
		}
		p, err := client.GetQuoteProvider()
		if err != nil {
			return nil, fmt.Errorf("tdx: %w", err)
		}
		qp = p
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Issuer{qp: qp, ccelTable: cmp.Or(cfg.CCELTable, DefaultCCELTable), ccelData: cmp.Or(cfg.CCELData, DefaultCCELData), log: log}, nil
}

// Available reports whether this machine offers a TDX guest interface
// (configfs-tsm with the tdx_guest provider, or the TDX guest device), for
// the agent's "auto" variant selection.
func Available() bool {
	if p, err := client.GetQuoteProvider(); err == nil && p.IsSupported() == nil {
		return true
	}
	_, err := os.Stat(guestDevice)
	return err == nil
}

// Variant is VARIANT_TDX.
func (i *Issuer) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_TDX }

// Attest gets a quote whose REPORTDATA is binding followed by 32 zero
// bytes and returns it, without the kernel buffer's zero padding, as
// serialized TDXEvidence.
func (i *Issuer) Attest(ctx context.Context, binding []byte) (attest.Attestation, error) {
	rd, err := wire.ReportData(binding)
	if err != nil {
		return nil, fmt.Errorf("tdx: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	raw, err := client.GetRawQuote(i.qp, rd)
	if err != nil {
		return nil, fmt.Errorf("%w: tdx: get quote: %w", attest.ErrDevice, err)
	}
	quote, err := checkOwnQuote(raw, rd)
	if err != nil {
		return nil, err
	}
	table, log, err := i.readCCEL()
	if err != nil {
		return nil, err
	}
	ev, err := wire.EncodeEvidence(wire.Evidence{Quote: quote, CCELTable: table, CCEL: log})
	if err != nil {
		return nil, fmt.Errorf("tdx: %w", err)
	}
	i.log.Info("tdx quote", logkey.QuoteBytes, len(quote), logkey.EventLogBytes, len(log))
	return &attestation{evidence: ev}, nil
}

// readCCEL reads the CC event log, its padding cut; nil, nil when the
// firmware provides none.
func (i *Issuer) readCCEL() (table, log []byte, err error) {
	table, err = readLimited(i.ccelTable, wire.MaxCCELTableSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tdx: CCEL table: %w", err)
	}
	// The region is larger than the log it holds: read it whole, bounded.
	log, err = readLimited(i.ccelData, 4*wire.MaxCCELSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tdx: CC event log: %w", err)
	}
	log = wire.TrimCCEL(log)
	if len(log) == 0 || len(log) > wire.MaxCCELSize {
		return nil, nil, fmt.Errorf("tdx: CC event log of %d bytes (want 1 to %d)", len(log), wire.MaxCCELSize)
	}
	return table, log, nil
}

func readLimited(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s is over %d bytes", path, limit)
	}
	return b, nil
}

// checkOwnQuote trims the padding of a quote the module returned and
// checks that it parses and carries the requested REPORTDATA, so a device
// that answers with something else fails here, not at the verifier.
func checkOwnQuote(raw []byte, rd [wire.ReportDataSize]byte) ([]byte, error) {
	quote, err := wire.TrimQuote(raw)
	if err != nil {
		return nil, fmt.Errorf("tdx: %w", err)
	}
	anyQ, err := abi.QuoteToProto(quote)
	if err != nil {
		return nil, fmt.Errorf("tdx: parse own quote: %w", err)
	}
	q, ok := anyQ.(*pb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("tdx: own quote of type %T is not version 4", anyQ)
	}
	if !bytes.Equal(q.GetTdQuoteBody().GetReportData(), rd[:]) {
		return nil, errors.New("tdx: quote does not carry the requested REPORTDATA")
	}
	return quote, nil
}

// Close releases nothing: go-tdx-guest's providers open the interface per
// request.
func (i *Issuer) Close() error { return nil }

type attestation struct{ evidence []byte }

func (a *attestation) Evidence() []byte { return a.evidence }

// Respond refuses: TDX evidence needs no challenge, so a verifier that
// sends one is not speaking this protocol.
func (a *attestation) Respond(context.Context, []byte) ([]byte, error) {
	return nil, errors.New("tdx: the TDX variant takes no challenge")
}

func (a *attestation) Close() error { return nil }

// Values are the reference values of this TD as its own quote reports
// them, hex-encoded under the names of the verifier's tdx policy section
// (attest/tdx.Policy), which this package does not link.
type Values struct {
	MRTDs            []string   `json:"mrtds"`
	RTMRs            [][]string `json:"rtmrs"`
	Attributes       []string   `json:"attributes"`
	XFAMs            []string   `json:"xfams"`
	MRConfigIDs      []string   `json:"mrConfigIDs,omitempty"`
	MROwners         []string   `json:"mrOwners,omitempty"`
	MROwnerConfigs   []string   `json:"mrOwnerConfigs,omitempty"`
	MinimumTeeTcbSvn string     `json:"minimumTeeTcbSvn"`
}

// Measure reads this TD's quote (REPORTDATA all zeros) and returns the
// values that accept exactly this TD: MRTD, RTMR[0..3], ATTRIBUTES, XFAM,
// the host-set identities when set, and its TEE_TCB_SVN as the minimum.
// It does not verify the quote (it never leaves the machine);
// `latchkey-agent measure` prints it as a golden snippet. A debug TD is
// still refused by every policy without allowDebug.
func Measure(cfg Config) (*Values, error) {
	iss, err := New(cfg)
	if err != nil {
		return nil, err
	}
	var rd [wire.ReportDataSize]byte
	raw, err := client.GetRawQuote(iss.qp, rd)
	if err != nil {
		return nil, fmt.Errorf("%w: tdx: get quote: %w", attest.ErrDevice, err)
	}
	quote, err := checkOwnQuote(raw, rd)
	if err != nil {
		return nil, err
	}
	q, _ := abi.QuoteToProto(quote) // checkOwnQuote parsed it
	return valuesOf(q.(*pb.QuoteV4).GetTdQuoteBody()), nil
}

func valuesOf(b *pb.TDQuoteBody) *Values {
	v := &Values{
		MRTDs:            []string{hex.EncodeToString(b.GetMrTd())},
		Attributes:       []string{hex.EncodeToString(b.GetTdAttributes())},
		XFAMs:            []string{hex.EncodeToString(b.GetXfam())},
		MRConfigIDs:      nonZeroHex(b.GetMrConfigId()),
		MROwners:         nonZeroHex(b.GetMrOwner()),
		MROwnerConfigs:   nonZeroHex(b.GetMrOwnerConfig()),
		MinimumTeeTcbSvn: hex.EncodeToString(b.GetTeeTcbSvn()),
	}
	for _, r := range b.GetRtmrs() {
		v.RTMRs = append(v.RTMRs, []string{hex.EncodeToString(r)})
	}
	return v
}

func nonZeroHex(b []byte) []string {
	for _, c := range b {
		if c != 0 {
			return []string{hex.EncodeToString(b)}
		}
	}
	return nil
}
