// Package issuer is the agent's half of the AMD SEV-SNP variant: it
// asks the guest's AMD secure processor (configfs-tsm, or
// /dev/sev-guest, through go-sev-guest's client) for an attestation
// report whose REPORT_DATA carries the session binding, with the host's
// certificate table when it supplies one. Measure prints the guest's
// reference values for `latchkey-agent measure`.
//
// The verifier's half is attest/snp; the evidence encoding and the
// policy document's shape both read are attest/snp/wire. The issuer
// links none of go-sev-guest's verification (verify, validate, kds,
// the AMD trust roots) and the validator none of its guest device code.
package issuer
