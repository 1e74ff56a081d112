// Package wire is what both halves of the TPM variant share: the
// evidence's size limits, the PCR selection and digest a quote carries,
// the decoding of systemd's measurement log, and the shape of the
// policy document (`latchkey-agent measure` prints it, the verifier
// reads it).
//
// It opens no device and verifies nothing, so the agent's issuer
// (attest/tpm/issuer) and the verifier's validator (attest/tpm) both
// link it without linking each other's code.
package wire
