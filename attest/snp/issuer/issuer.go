package issuer

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"
	spb "github.com/google/go-sev-guest/proto/sevsnp"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/wire"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Config configures New and Measure.
type Config struct {
	// QuoteProvider gets reports. nil selects the platform's through
	// go-sev-guest: configfs-tsm on current kernels, else /dev/sev-guest.
	// Tests inject go-sev-guest's test provider (see snptest).
	QuoteProvider client.QuoteProvider
	// VMPL, when set, requests the report at that VM privilege level; the
	// provider must then be a client.LeveledQuoteProvider. nil leaves the
	// level to the provider (VMPL 0 for a guest without an SVSM).
	VMPL *uint
	// Logger receives one line per report (default slog.Default()).
	Logger *slog.Logger
}

// Issuer produces SNP evidence on the agent. It implements attest.Issuer.
type Issuer struct {
	qp   client.QuoteProvider
	vmpl *uint
	log  *slog.Logger
}

var _ attest.Issuer = (*Issuer)(nil)

// New returns an issuer over cfg's quote provider, failing when the
// machine offers no SEV-SNP guest interface.
func New(cfg Config) (*Issuer, error) {
	qp := cfg.QuoteProvider
	if qp == nil {
		var err error
		if qp, err = client.GetQuoteProvider(); err != nil {
			return nil, fmt.Errorf("snp: %w", err)
		}
	}
	if cfg.VMPL != nil {
		if *cfg.VMPL > 3 {
			return nil, fmt.Errorf("snp: VMPL %d is not 0-3", *cfg.VMPL)
		}
		if _, ok := qp.(client.LeveledQuoteProvider); !ok {
			return nil, errors.New("snp: the quote provider cannot request a VMPL")
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Issuer{qp: qp, vmpl: cfg.VMPL, log: log}, nil
}

// Available reports whether this machine offers an SEV-SNP guest
// interface (configfs-tsm with the sev_guest provider, or /dev/sev-guest),
// for the agent's "auto" variant selection.
func Available() bool {
	_, err := client.GetQuoteProvider()
	return err == nil
}

// Variant is VARIANT_SNP.
func (i *Issuer) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_SNP }

// Attest gets a report whose REPORT_DATA is binding followed by 32 zero
// bytes, with the host's certificate table when it supplies one, and
// returns it as serialized SNPEvidence.
func (i *Issuer) Attest(ctx context.Context, binding []byte) (attest.Attestation, error) {
	if len(binding) != attest.BindingSize {
		return nil, fmt.Errorf("snp: binding is %d bytes, want %d", len(binding), attest.BindingSize)
	}
	var data [abi.ReportDataSize]byte
	copy(data[:], binding)
	report, table, err := i.quote(ctx, data)
	if err != nil {
		return nil, err
	}
	ev, err := wire.EncodeEvidence(report, table)
	if err != nil {
		return nil, fmt.Errorf("snp: %w", err)
	}
	i.log.Info("snp report", logkey.CertificateTableBytes, len(table))
	return &attestation{evidence: ev}, nil
}

// quote gets one report and splits the provider's output into the report
// and the certificate table, checking that the report carries data.
func (i *Issuer) quote(ctx context.Context, data [abi.ReportDataSize]byte) (report, table []byte, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var raw []byte
	if i.vmpl != nil {
		raw, err = i.qp.(client.LeveledQuoteProvider).GetRawQuoteAtLevel(data, *i.vmpl)
	} else {
		raw, err = i.qp.GetRawQuote(data)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("snp: get report: %w", err)
	}
	if len(raw) < abi.ReportSize {
		return nil, nil, fmt.Errorf("snp: quote of %d bytes is shorter than a report", len(raw))
	}
	report, table = raw[:abi.ReportSize], raw[abi.ReportSize:]
	parsed, err := abi.ReportToProto(report)
	if err != nil {
		return nil, nil, fmt.Errorf("snp: parse own report: %w", err)
	}
	if !bytes.Equal(parsed.GetReportData(), data[:]) {
		return nil, nil, errors.New("snp: report does not carry the requested REPORT_DATA")
	}
	return report, table, nil
}

// Close releases nothing: go-sev-guest's providers open the device per
// request.
func (i *Issuer) Close() error { return nil }

type attestation struct{ evidence []byte }

func (a *attestation) Evidence() []byte { return a.evidence }

// Respond refuses: SNP evidence needs no challenge, so a verifier that
// sends one is not speaking this protocol.
func (a *attestation) Respond(context.Context, []byte) ([]byte, error) {
	return nil, errors.New("snp: the SNP variant takes no challenge")
}

func (a *attestation) Close() error { return nil }

// Measure reads this guest's current report and returns the wire.Policy that
// accepts exactly this guest: its measurement, its TCB as the minimum, its
// guest SVN, VMPL, migration agent, CXL and SMT settings, and its ID block
// and host data when set. It does not verify the report (it never leaves
// the machine); `latchkey-agent measure` prints it as a golden snippet.
// A guest launched with DEBUG would still be refused by every policy.
func Measure(ctx context.Context, cfg Config) (*wire.Policy, error) {
	iss, err := New(cfg)
	if err != nil {
		return nil, err
	}
	var data [abi.ReportDataSize]byte
	raw, _, err := iss.quote(ctx, data)
	if err != nil {
		return nil, err
	}
	r, err := abi.ReportToProto(raw)
	if err != nil {
		return nil, fmt.Errorf("snp: parse report: %w", err)
	}
	return policyOf(r)
}

// policyOf is the wire.Policy accepting exactly report r.
func policyOf(r *spb.Report) (*wire.Policy, error) {
	gp, err := abi.ParseSnpPolicy(r.GetPolicy())
	if err != nil {
		return nil, fmt.Errorf("snp: guest policy: %w", err)
	}
	signer, err := abi.ParseSignerInfo(r.GetSignerInfo())
	if err != nil {
		return nil, fmt.Errorf("snp: signer info: %w", err)
	}
	info, _ := abi.ParseSnpPlatformInfo(r.GetPlatformInfo())
	p := &wire.Policy{
		Measurements:        []string{hex.EncodeToString(r.GetMeasurement())},
		MinimumTCB:          wire.TCBFromVersion(r.GetReportedTcb()),
		MinimumGuestSVN:     r.GetGuestSvn(),
		AllowMigrationAgent: gp.MigrateMA,
		AllowCXL:            gp.CXLAllowed,
		VMPLs:               []uint32{r.GetVmpl()},
		IDKeyDigests:        nonZeroHex(r.GetIdKeyDigest()),
		FamilyIDs:           nonZeroHex(r.GetFamilyId()),
		ImageIDs:            nonZeroHex(r.GetImageId()),
		HostData:            nonZeroHex(r.GetHostData()),
	}
	if info.SMTEnabled {
		p.SMT = wire.SMTAllowed
	}
	if signer.AuthorKeyEn {
		p.AuthorKeyDigests = nonZeroHex(r.GetAuthorKeyDigest())
	}
	return p, nil
}

func nonZeroHex(b []byte) []string {
	if bytes.Equal(b, make([]byte, len(b))) {
		return nil
	}
	return []string{hex.EncodeToString(b)}
}
