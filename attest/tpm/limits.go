package tpm

import "github.com/latchkey/latchkey/attest"

// Size limits of everything the verifier and the agent accept from the
// other side. Each TPM structure is far below its limit on real TPMs (an
// RSA-2048 TPMT_PUBLIC is about 310 bytes, a quote about 150, real EK
// certificates 1-1.5 KiB); the limits only stop a peer from making either
// side parse or buffer megabytes.
const (
	// MaxEvidenceSize bounds a serialized TPMEvidence.
	MaxEvidenceSize = 16 << 10
	// MaxEKCertificateSize bounds the DER EK certificate, in the evidence
	// and when the agent reads it from NV.
	MaxEKCertificateSize = 8 << 10
	// maxStructSize bounds each TPM wire structure in the evidence
	// (public areas, quote, signature).
	maxStructSize = 1 << 10
	// MaxChallengeSize bounds a serialized TPMChallenge (agent side) and
	// MaxChallengeResponseSize a TPMChallengeResponse (verifier side).
	MaxChallengeSize         = 2 << 10
	MaxChallengeResponseSize = 256
	// maxPCR is the highest PCR index of a PC-client TPM.
	maxPCR = 23
	// secretSize is the credential-activation secret's length.
	secretSize = 32
	// bindingSize is the qualifying data the quote must carry.
	bindingSize = attest.BindingSize
)
