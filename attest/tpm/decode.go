package tpm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest/tpm/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// evidence is a TPMEvidence that passed decoding and shape checks. Nothing
// in it is trusted yet.
type evidence struct {
	akRaw     []byte
	ak        *tpm2.TPMTPublic
	akKey     *ecdsa.PublicKey // set by Validator.trustAK after checkAK
	ekRaw     []byte           // parsed by decodeEK, only when the AK is not pinned
	ekCertRaw []byte
	ek        *tpm2.TPMTPublic  // nil when absent
	ekCert    *x509.Certificate // nil when absent
	quoteRaw  []byte
	quote     *tpm2.TPMSAttest
	quoteInfo *tpm2.TPMSQuoteInfo
	sig       *tpm2.TPMTSignature
	pcrs      map[int][]byte
	fwLog     []byte // firmware event log, replayed by bootlog.Replay
	sdLog     []byte // systemd event log
	pcrSig    []PCR11Signature
}

// decode parses serialized TPMEvidence and checks its sizes and shape.
func decode(raw []byte) (*evidence, error) {
	if len(raw) > wire.MaxEvidenceSize {
		return nil, fmt.Errorf("evidence has %d bytes, limit %d", len(raw), wire.MaxEvidenceSize)
	}
	var pb latchkeyv1.TPMEvidence
	if err := proto.Unmarshal(raw, &pb); err != nil {
		return nil, fmt.Errorf("parse evidence: %w", err)
	}
	if err := checkSizes(&pb); err != nil {
		return nil, err
	}
	ev := &evidence{akRaw: pb.AkPublic, quoteRaw: pb.Quote}
	var err error
	if ev.ak, err = parseCanonical[tpm2.TPMTPublic](pb.AkPublic, "ak public"); err != nil {
		return nil, err
	}
	if err := ev.decodeQuote(&pb); err != nil {
		return nil, err
	}
	ev.ekRaw, ev.ekCertRaw = pb.EkPublic, pb.EkCertificate
	if ev.pcrs, err = decodePCRs(pb.Pcrs); err != nil {
		return nil, err
	}
	if len(pb.SystemdEventLog) > 0 && len(pb.FirmwareEventLog) == 0 {
		return nil, errors.New("systemd event log without a firmware event log")
	}
	ev.fwLog, ev.sdLog = pb.FirmwareEventLog, pb.SystemdEventLog
	if len(pb.PcrSignature) > 0 {
		if ev.pcrSig, err = decodePCRSignature(pb.PcrSignature); err != nil {
			return nil, err
		}
	}
	return ev, nil
}

// checkSizes bounds every field before anything is parsed.
func checkSizes(pb *latchkeyv1.TPMEvidence) error {
	for _, f := range []struct {
		name     string
		n, limit int
		required bool
	}{
		{"ak_public", len(pb.AkPublic), maxStructSize, true},
		{"quote", len(pb.Quote), maxStructSize, true},
		{"signature", len(pb.Signature), maxStructSize, true},
		{"ek_public", len(pb.EkPublic), maxStructSize, false},
		{"ek_certificate", len(pb.EkCertificate), wire.MaxEKCertificateSize, false},
		{"firmware_event_log", len(pb.FirmwareEventLog), wire.MaxFirmwareLogSize, false},
		{"systemd_event_log", len(pb.SystemdEventLog), wire.MaxSystemdLogSize, false},
		{"pcr_signature", len(pb.PcrSignature), wire.MaxPCRSignatureSize, false},
	} {
		if f.required && f.n == 0 {
			return fmt.Errorf("%s missing", f.name)
		}
		if f.n > f.limit {
			return fmt.Errorf("%s has %d bytes, limit %d", f.name, f.n, f.limit)
		}
	}
	if len(pb.Pcrs) > maxPCR+1 {
		return fmt.Errorf("%d pcrs, at most %d", len(pb.Pcrs), maxPCR+1)
	}
	return nil
}

// decodeQuote parses the TPMS_ATTEST and the signature and checks that
// the structure claims to be a TPM-generated quote.
func (ev *evidence) decodeQuote(pb *latchkeyv1.TPMEvidence) error {
	var err error
	if ev.quote, err = parse[tpm2.TPMSAttest](pb.Quote, "quote"); err != nil {
		return err
	}
	if ev.quote.Magic != tpm2.TPMGeneratedValue || ev.quote.Type != tpm2.TPMSTAttestQuote {
		return errors.New("quote is not a tpm-generated quote")
	}
	if ev.quoteInfo, err = ev.quote.Attested.Quote(); err != nil {
		return fmt.Errorf("quote info: %w", err)
	}
	if ev.sig, err = parse[tpm2.TPMTSignature](pb.Signature, "signature"); err != nil {
		return err
	}
	return nil
}

// decodeEK parses the EK public area and certificate. Verify calls it
// only when the AK is not pinned: a pinned AK makes the EK irrelevant, and
// skipping it saves a third of the decoding time.
func (ev *evidence) decodeEK() error {
	var err error
	if len(ev.ekRaw) > 0 {
		if ev.ek, err = parseCanonical[tpm2.TPMTPublic](ev.ekRaw, "ek public"); err != nil {
			return err
		}
	}
	if len(ev.ekCertRaw) > 0 {
		if ev.ekCert, err = x509.ParseCertificate(ev.ekCertRaw); err != nil {
			return fmt.Errorf("ek certificate: %w", err)
		}
	}
	return nil
}

func decodePCRs(in map[uint32][]byte) (map[int][]byte, error) {
	out := make(map[int][]byte, len(in))
	for idx, v := range in {
		if idx > maxPCR {
			return nil, fmt.Errorf("pcr %d out of range 0..%d", idx, maxPCR)
		}
		if len(v) != sha256.Size {
			return nil, fmt.Errorf("pcr %d value has %d bytes, want %d", idx, len(v), sha256.Size)
		}
		out[int(idx)] = v
	}
	return out, nil
}

// parseCanonical is parse for public areas, refusing bytes that do not
// marshal back identically (trailing data, non-minimal encodings): a key's
// TPM name is the hash of its bytes while the checks read the parsed
// value, and the two must describe the same key. The quote and signature
// need no such check (and skip its cost, a third of decoding): the quote's
// bytes are what the signature covers, and a restricted AK only signs
// quotes the TPM itself encoded.
func parseCanonical[T tpm2.Marshallable, P interface {
	*T
	tpm2.Unmarshallable
}](raw []byte, what string) (*T, error) {
	v, err := parse[T, P](raw, what)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(tpm2.Marshal(*v), raw) {
		return nil, fmt.Errorf("%s: not canonically encoded", what)
	}
	return v, nil
}

// parse unmarshals a TPM structure from untrusted bytes.
func parse[T tpm2.Marshallable, P interface {
	*T
	tpm2.Unmarshallable
}](raw []byte, what string) (v *T, err error) {
	defer func() { // go-tpm's reflection may panic on hostile input
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("%s: malformed", what)
		}
	}()
	v, err = tpm2.Unmarshal[T, P](raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}
