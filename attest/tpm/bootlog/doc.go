// Package bootlog replays a TPM's event logs (the firmware's TCG log and
// systemd's userspace log) against PCR values into a typed Boot: what
// was measured, by component, with nothing the digests do not prove.
//
// The verifier's TPM validator (attest/tpm) runs it on quoted PCRs as
// one step of verification; the agent's `measure` command runs it on
// the machine's own PCRs to print the component view and policy. It
// opens no device and judges no policy, so linking it brings neither
// the TPM device code nor the validator.
package bootlog
