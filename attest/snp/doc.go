// Package snp is the Validator of latchkey's AMD SEV-SNP evidence variant
// (verifier side): it checks an attestation report against a policy,
// built on github.com/google/go-sev-guest. The issuer that gets the report
// from the guest's AMD secure processor (agent side) is beside it in
// attest/snp/issuer, and the evidence encoding both read in
// attest/snp/wire: separate packages, so the agent links none of
// go-sev-guest's verification and the verifier none of its guest device
// code.
//
// The evidence is a latchkeyv1.SNPEvidence message: the raw 1184-byte
// ATTESTATION_REPORT whose REPORT_DATA is the 32-byte attested-TLS binding
// followed by 32 zero bytes, and the GHCB extended-report certificate table
// when the host supplies one. SNP needs no challenge round trip: the
// report is signed by the chip's VCEK (or the cloud's VLEK), whose
// certificate chains to AMD's root key, and the binding ties it to the TLS
// session it was made for.
//
// The verifier never calls AMD's servers on the join path. The endorsement
// key certificate comes from the report's certificate table, or else from
// a Collateral cache the operator fills ahead of time (FetchCollateral),
// optionally shared between verifier replicas through a ConfigMap.
// Parsed certificates and verified chains are cached in memory, so a join
// from a known chip costs one ECDSA P-384 signature verification plus field
// comparisons.
package snp
