package attest

// SealFacts are the measured facts an offline grant is built from
// (docs/offline-unlock.md): the PCR values a later boot must reproduce
// for the node's TPM to release its sealed disk key, and the TPM's
// reset count and clock the boot and time bounds count from. Every value
// is read from signed, verified evidence, never from what the agent says
// about it.
type SealFacts struct {
	// PCRs are SHA-256 values by PCR index.
	PCRs map[uint32][]byte
	// ResetCount and ClockMS are the quote's TPMS_CLOCK_INFO.
	ResetCount uint32
	ClockMS    uint64
}

// Sealer is implemented by a State whose machine can seal a key to its
// measurements (a TPM's). A State that does not implement it (SEV-SNP
// without a vTPM) gets no offline grant.
type Sealer interface {
	// SealFacts returns the facts for a grant that opens at the point of
	// the next boot where the agent joins. quotedAtJoin says the evidence
	// was made there (a join or rejoin); a re-attestation's evidence is
	// made later in the boot, and the state must then derive the
	// join-point values from its verified logs. An error says why no
	// grant can be built from this state (it refuses nothing).
	SealFacts(quotedAtJoin bool) (SealFacts, error)
}
