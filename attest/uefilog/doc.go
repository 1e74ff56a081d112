// Package uefilog is what the TPM and TDX event-log replays share: the
// reading of UEFI and systemd-stub measurements that does not depend on
// the hash (SHA-256 PCRs, SHA-384 RTMRs) or on the register numbering,
// and the placement of boot applications the component policies judge.
//
// It judges no register value and opens nothing: both the agent (through
// attest/tpm/bootlog, for `latchkey-agent measure`) and the validators
// link it, so it must never import a validator or an issuer.
package uefilog
