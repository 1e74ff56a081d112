package wire

import "github.com/latchkey/latchkey/attest"

// Size limits of everything the verifier and the agent accept from the
// other side. Each TPM structure is far below its limit on real TPMs (an
// RSA-2048 TPMT_PUBLIC is about 310 bytes, a quote about 150, real EK
// certificates 1-1.5 KiB); the limits only stop a peer from making either
// side parse or buffer megabytes.
const (
	// MaxEvidenceSize bounds a serialized TPMEvidence: 16 KiB for the
	// TPM structures, PCRs and EK certificate, plus each log's limit
	// (208 KiB in all). attest.MaxEvidenceSize, the transport's bound,
	// is at least this (checked below at compile time).
	MaxEvidenceSize = 16<<10 + MaxFirmwareLogSize + MaxSystemdLogSize + MaxPCRSignatureSize
	// MaxEKCertificateSize bounds the DER EK certificate, in the evidence
	// and when the agent reads it from NV.
	MaxEKCertificateSize = 8 << 10
	// MaxStructSize bounds each TPM wire structure in the evidence
	// (public areas, quote, signature) and in a challenge.
	MaxStructSize = 1 << 10
	// MaxChallengeSize bounds a serialized TPMChallenge (agent side) and
	// MaxChallengeResponseSize a TPMChallengeResponse (verifier side).
	MaxChallengeSize         = 2 << 10
	MaxChallengeResponseSize = 256
	// MaxPCR is the highest PCR index of a PC-client TPM.
	MaxPCR = 23
	// SecretSize is the credential-activation secret's length.
	SecretSize = 32
)

// Event-log limits. OVMF's firmware log is 20-40 KiB (most of it the
// Secure Boot databases, about 1.5 KiB per db certificate); physical
// machines with many option ROMs reach 60-90 KiB. systemd's userspace log
// is a few hundred bytes per record, a dozen records per boot, and the
// PCR signature JSON about 1.5 KiB per (bank, phase) entry of an RSA-2048
// key. The evidence limit is the sum of every field's limit, so a message
// within each field's limit is never refused as a whole.
const (
	// MaxFirmwareLogSize bounds TPMEvidence.firmware_event_log.
	MaxFirmwareLogSize = 128 << 10
	// MaxFirmwareEvents bounds the events of a firmware log (OVMF: ~60).
	MaxFirmwareEvents = 4096
	// MaxSystemdLogSize bounds TPMEvidence.systemd_event_log.
	MaxSystemdLogSize = 32 << 10
	// MaxSystemdEvents bounds the records of a systemd log.
	MaxSystemdEvents = 256
	// MaxPCRSignatureSize bounds TPMEvidence.pcr_signature.
	MaxPCRSignatureSize = 32 << 10
	// MaxPCRSignatureEntries bounds the sha256 entries of a signature.
	MaxPCRSignatureEntries = 64
)

// The transport must carry the largest TPM evidence: this fails to compile
// (a negative array length) otherwise.
var _ [attest.MaxEvidenceSize - MaxEvidenceSize]struct{}
