// Package wire is what both halves of the SEV-SNP variant share: the
// SNPEvidence encoding and its limits, the shape-only decoding of a
// report and its certificate table, and the shape of the policy
// document's snp section (`latchkey-agent measure` prints it, the
// verifier reads it).
//
// It reaches no guest device and verifies no signature or certificate,
// so the agent's issuer (attest/snp/issuer) and the verifier's
// validator (attest/snp) both link it without each other's code.
package wire
