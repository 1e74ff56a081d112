// Package issuer is the agent's half of the TPM variant: it opens the
// TPM (a character device or a swtpm's command port), creates the EK and
// the AK, quotes the PCRs with the session binding, reads the event logs
// and the EK certificate, and answers the verifier's credential
// challenge with TPM2_ActivateCredential. Measure and MeasureBoot print
// the machine's reference values for `latchkey-agent measure`.
//
// The verifier's half, which checks this evidence, is attest/tpm; what
// both read (limits, PCR selection, the policy document's shape) is
// attest/tpm/wire. The issuer links no verification code and the
// validator no device code, so each binary carries only its own half.
package issuer
