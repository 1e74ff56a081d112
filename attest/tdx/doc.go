// Package tdx is the verifier side of latchkey's Intel TDX evidence
// variant: the Validator that checks a TD quote against a Policy, built on
// github.com/google/go-tdx-guest. The agent side, which asks the TDX
// module for the quote, is attest/tdx/issuer; the TDXEvidence encoding
// both share is attest/tdx/wire. The validator links no device code and
// the issuer no verification code.
//
// The evidence is a latchkeyv1.TDXEvidence message: the raw version 4 TD
// quote whose REPORTDATA is the 32-byte attested-TLS binding followed by 32
// zero bytes. The quote is signed by the quoting enclave's attestation key,
// which the QE report certifies under the platform's PCK key, whose
// certificate (in the quote) chains to Intel's SGX root CA. TDX needs no
// challenge round trip: the binding ties the quote to the TLS session.
// When the firmware exposes the CC event log (ACPI CCEL), the evidence
// carries it and Verify replays it against the quoted RTMRs; the state
// holds only what replayed events say.
//
// The verifier never calls Intel's servers on the join path. The TCB info
// (per platform family, FMSPC), the TD QE identity and the CRLs come from
// an offline Collateral cache that `latchkey-verifier collateral fetch`
// (FetchCollateral) fills ahead of time; each item's signature, signing
// chain, revocation and dates are checked against the policy's trusted
// roots whenever a quote needs it.
//
// # Identity
//
// A TD quote names no chip the way an SNP report's CHIP_ID does, and
// nothing in the TD report is both per machine and stable: MRTD and the
// RTMRs name the software, and MRCONFIGID, MROWNER and MROWNERCONFIG are
// whatever the host sets. What names the machine is the PCK certificate:
// its PPID (platform provisioning ID, an Intel SGX extension) is fixed per
// platform and survives TCB recoveries, which give the platform new PCK
// keys and certificates. The machine identity bindings use is therefore
// "tdx-ppid:<PPID hex>", optionally with the TD's MRCONFIGID appended
// (Policy.BindMRConfigID). Every TD on one platform shares the PPID, so
// without a per-TD MRCONFIGID the platform, not the TD, is what a disk or
// node name is bound to.
package tdx
