// Package tpm is latchkey's TPM 2.0 evidence variant (VARIANT_TPM): the
// Issuer the agent runs against its TPM and the Validator the verifier runs
// against a policy, side by side because they share one evidence format.
//
// Evidence (latchkeyv1.TPMEvidence) is a TPM2_Quote over the configured
// SHA-256 PCRs, made by a restricted ECC P-256 attestation key (AK) with the
// 32-byte attested-TLS binding as qualifying data, plus the PCR values, the
// AK and endorsement key (EK) public areas and the EK certificate from NV.
// A restricted signing key only signs structures the TPM itself produced,
// so a valid signature by a trusted AK proves the quote came from that TPM.
// With them come the firmware and systemd event logs and the UKI's PCR 11
// signature JSON; Verify replays the logs against the quoted PCRs into a
// typed Boot (bootlog.go), and CheckPolicy compares that with the raw PCR
// lists and the component policy (components.go), as two steps.
//
// The verifier trusts an AK in one of two ways, never by first use:
//   - the AK is pinned in the policy (akPublicKeyHashes), or
//   - the EK is trusted (its certificate chains to ekCARoots, or its public
//     key hash is in ekPublicKeyHashes) and the agent proves, by
//     TPM2_ActivateCredential in one Challenge round trip, that the AK lives
//     in the same TPM as that EK.
//
// Both keys are primary keys derived from the TPM's hierarchy seeds (EK:
// endorsement, TCG default RSA-2048 template, taken from its persistent
// handle 0x81010001 when provisioned there; AK: endorsement hierarchy, so
// its quotes carry the TPM's own resetCount: keys.go), so they are the
// same at every boot and an AK pin survives reboots (and TPM2_Clear).
//
// swtpm has no resource manager and only three transient object slots: an
// Attestation holds at most two (the AK, and the EK unless it is
// persisted) on a connection of its own and flushes them on Close, and on
// every error path.
package tpm
