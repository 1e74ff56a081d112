package wire

import (
	"fmt"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

const (
	// MaxEvidenceSize bounds a serialized SNPEvidence message. A report is
	// 1184 bytes and a certificate table with VCEK, ASK and ARK about 5 KiB.
	MaxEvidenceSize = 64 << 10
	// MaxCertTableSize bounds the certificate table inside the evidence.
	MaxCertTableSize = 48 << 10
	// maxCertTableEntries bounds the entries of a certificate table; hosts
	// send three to six.
	maxCertTableEntries = 32
)

// The limits agree: SNP evidence fits the transport's bound on every
// variant's evidence, and a report with the largest certificate table
// accepted (plus 1 KiB of protobuf framing) fits MaxEvidenceSize, so no
// evidence passes one bound and fails the other. Each line fails to
// compile when its bound is broken.
var (
	_ [attest.MaxEvidenceSize - MaxEvidenceSize]struct{}
	_ [MaxEvidenceSize - (MaxCertTableSize + abi.ReportSize + 1<<10)]struct{}
)

var (
	vcekGUID = uuid.MustParse(abi.VcekGUID)
	vlekGUID = uuid.MustParse(abi.VlekGUID)
)

// Evidence is decoded but not yet verified SNP evidence. DecodeEvidence
// guarantees its shape only; nothing in it is trustworthy before the
// validator (attest/snp) has verified it.
type Evidence struct {
	// Raw is the 1184-byte attestation report as the chip signed it.
	Raw []byte
	// Report is Raw parsed by go-sev-guest's abi package.
	Report *spb.Report
	// Signer says which key kind signed the report (VCEK or VLEK).
	Signer abi.SignerInfo
	// Endorsement is the DER certificate of the signing key (VCEK or VLEK)
	// from the certificate table, nil when the table has none.
	Endorsement []byte
	// CertTable is the raw certificate table, possibly empty.
	CertTable []byte
}

// EncodeEvidence serializes a report and its certificate table (may be
// empty) as a latchkeyv1.SNPEvidence message.
func EncodeEvidence(report, certTable []byte) ([]byte, error) {
	if len(report) != abi.ReportSize {
		return nil, fmt.Errorf("report is %d bytes, want %d", len(report), abi.ReportSize)
	}
	b, err := proto.Marshal(&latchkeyv1.SNPEvidence{Report: report, CertificateTable: certTable})
	if err != nil {
		return nil, fmt.Errorf("marshal snp evidence: %w", err)
	}
	if len(b) > MaxEvidenceSize {
		return nil, fmt.Errorf("snp evidence of %d bytes exceeds %d", len(b), MaxEvidenceSize)
	}
	return b, nil
}

// DecodeEvidence checks the shape of serialized SNPEvidence and parses it.
// Every failure is a MALFORMED *attest.Refusal. It never panics and
// allocates at most a small multiple of the input size, so it is safe on
// unauthenticated input (FuzzDecodeEvidence exercises it).
func DecodeEvidence(evidence []byte) (*Evidence, error) {
	if len(evidence) > MaxEvidenceSize {
		return nil, malformed("evidence of %d bytes exceeds %d", len(evidence), MaxEvidenceSize)
	}
	var msg latchkeyv1.SNPEvidence
	if err := proto.Unmarshal(evidence, &msg); err != nil {
		return nil, malformed("decode snp evidence: %w", err)
	}
	if len(msg.ProtoReflect().GetUnknown()) != 0 {
		return nil, malformed("snp evidence carries unknown fields")
	}
	ev, err := decodeReport(msg.GetReport())
	if err != nil {
		return nil, err
	}
	ev.CertTable = msg.GetCertificateTable()
	ev.Endorsement, err = endorsementFromTable(ev.CertTable, ev.Signer.SigningKey)
	if err != nil {
		return nil, err
	}
	return ev, nil
}

func decodeReport(raw []byte) (*Evidence, error) {
	switch {
	case len(raw) < abi.ReportSize:
		return nil, malformed("report truncated: %d bytes, want %d", len(raw), abi.ReportSize)
	case len(raw) > abi.ReportSize:
		return nil, malformed("report oversized: %d bytes, want %d", len(raw), abi.ReportSize)
	}
	if err := abi.ValidateReportFormat(raw); err != nil {
		return nil, malformed("report format: %w", err)
	}
	report, err := abi.ReportToProto(raw)
	if err != nil {
		return nil, malformed("parse report: %w", err)
	}
	if report.GetSignatureAlgo() != abi.SignEcdsaP384Sha384 {
		return nil, malformed("report signature algorithm %d is not ECDSA P-384 with SHA-384", report.GetSignatureAlgo())
	}
	info, err := abi.ParseSignerInfo(report.GetSignerInfo())
	if err != nil {
		return nil, malformed("report signer info: %w", err)
	}
	if info.SigningKey != abi.VcekReportSigner && info.SigningKey != abi.VlekReportSigner {
		return nil, malformed("report signing key is %v, want VCEK or VLEK", info.SigningKey)
	}
	return &Evidence{Raw: raw, Report: report, Signer: info}, nil
}

// endorsementFromTable returns the signing key's certificate from a GHCB
// certificate table, whose header go-sev-guest's abi package parses.
func endorsementFromTable(table []byte, key abi.ReportSigner) ([]byte, error) {
	if len(table) == 0 {
		return nil, nil
	}
	if len(table) > MaxCertTableSize {
		return nil, malformed("certificate table of %d bytes exceeds %d", len(table), MaxCertTableSize)
	}
	headers, err := abi.ParseSnpCertTableHeader(table)
	if err != nil {
		return nil, malformed("certificate table: %w", err)
	}
	if len(headers) > maxCertTableEntries {
		return nil, malformed("certificate table has %d entries, at most %d allowed", len(headers), maxCertTableEntries)
	}
	want := vcekGUID
	if key == abi.VlekReportSigner {
		want = vlekGUID
	}
	return uniqueEntry(table, headers, want)
}

// uniqueEntry returns the bytes of the table entry with guid (nil when
// absent), checking every entry's bounds. It slices the table instead of
// copying it as abi.CertTable.Unmarshal would, and unlike that parser it
// cannot be fooled by an offset+length that overflows 32 bits.
func uniqueEntry(table []byte, headers []abi.CertTableHeaderEntry, guid uuid.UUID) ([]byte, error) {
	var found []byte
	for i, h := range headers {
		end := uint64(h.Offset) + uint64(h.Length)
		if end > uint64(len(table)) {
			return nil, malformed("certificate table entry %d (offset %d, length %d) lies outside the %d-byte table",
				i, h.Offset, h.Length, len(table))
		}
		if h.GUID != guid || h.Length == 0 {
			continue
		}
		if found != nil {
			return nil, malformed("certificate table lists %s twice", guid)
		}
		found = table[h.Offset:end:end]
	}
	return found, nil
}

func malformed(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_MALFORMED, format, args...)
}
