package wire

// Policy is the snp section of the verifier's policy file: the reference
// values an SEV-SNP report must match. It is parsed strictly and
// case-sensitively (verifier/policy, through internal/strictyaml), so field
// names are exactly the camelCase JSON tags below.
//
// Every reference value is a list, so an image upgrade rolls out by
// listing the old and new values together. The zero value accepts nothing:
// no measurement listed means no report passes, debug is always refused,
// the migration agent and SMT are refused, only VMPL 0 is accepted, and
// only AMD's own roots are trusted. Example:
//
//	measurements: ["<96 hex digits>"]
//	minimumTCB: {bootloader: 3, tee: 0, snp: 8, microcode: 115}
//	minimumGuestSVN: 0
//	smt: allowed
//	vmpls: [0]
type Policy struct {
	// Measurements lists the accepted launch measurements (48 bytes, hex).
	// The measurement changes with the image and with the vCPU count, so a
	// fleet lists one per image and vCPU shape.
	Measurements []string `json:"measurements,omitempty"`
	// MinimumTCB is the component-wise minimum of REPORTED_TCB.
	MinimumTCB TCB `json:"minimumTCB,omitempty"`
	// MinimumGuestSVN is the minimum GUEST_SVN (from the ID block).
	MinimumGuestSVN uint32 `json:"minimumGuestSVN,omitempty"`
	// PermitProvisionalFirmware accepts a report whose committed firmware
	// (TCB, build, API version) is older than the running one. False keeps
	// a host from rolling firmware back after attestation.
	PermitProvisionalFirmware bool `json:"permitProvisionalFirmware,omitempty"`
	// AllowMigrationAgent accepts a guest policy with MIGRATE_MA set (a
	// migration agent can export the guest's memory). Default: refused.
	AllowMigrationAgent bool `json:"allowMigrationAgent,omitempty"`
	// AllowCXL accepts a guest policy with CXL_ALLOW set. Default: refused.
	AllowCXL bool `json:"allowCXL,omitempty"`
	// SMT says whether the host may run with simultaneous multithreading:
	// "forbidden" (the default, also written "") requires PLATFORM_INFO's
	// SMT_EN bit clear, so no sibling thread shares a core with the guest;
	// "allowed" accepts either. There is no "required": nothing is gained
	// by insisting on SMT.
	SMT SMTMode `json:"smt,omitempty"`
	// VMPLs lists the accepted VM privilege levels the report was requested
	// at (0-3). Empty means [0].
	VMPLs []uint32 `json:"vmpls,omitempty"`
	// IDKeyDigests, when not empty, lists the accepted ID_KEY_DIGEST values
	// (SHA-384 of the ID block's signing key, 48 bytes, hex).
	IDKeyDigests []string `json:"idKeyDigests,omitempty"`
	// AuthorKeyDigests, when not empty, lists the accepted
	// AUTHOR_KEY_DIGEST values (48 bytes, hex) and requires AUTHOR_KEY_EN.
	AuthorKeyDigests []string `json:"authorKeyDigests,omitempty"`
	// FamilyIDs, when not empty, lists the accepted FAMILY_ID values
	// (16 bytes, hex).
	FamilyIDs []string `json:"familyIDs,omitempty"`
	// ImageIDs, when not empty, lists the accepted IMAGE_ID values
	// (16 bytes, hex).
	ImageIDs []string `json:"imageIDs,omitempty"`
	// HostData, when not empty, lists the accepted HOST_DATA values
	// (32 bytes, hex).
	HostData []string `json:"hostData,omitempty"`
	// BindHostData mixes HOST_DATA into the machine identity disk UUIDs
	// and node names are bound to ("snp-chip:<CHIP_ID>/host-data:<hex>"
	// instead of "snp-chip:<CHIP_ID>"). Set it only when the platform
	// gives every VM its own HOST_DATA that stays the same across its
	// restarts: co-tenant VMs on one chip then get different identities.
	// Off, every VM on a chip shares one identity.
	BindHostData bool `json:"bindHostData,omitempty"`
	// TrustedRoots, when not empty, replaces the AMD roots go-sev-guest
	// ships (Milan, Genoa, Turin; VCEK and VLEK chains) as the only trusted
	// roots. Tests use it for go-sev-guest's fake chain; operators for a
	// root rotation.
	TrustedRoots []TrustedRoot `json:"trustedRoots,omitempty"`
}

// TCB is a minimum SEV-SNP TCB version by component (security patch
// levels). A report passes when every component is at least the minimum.
type TCB struct {
	Bootloader uint8 `json:"bootloader,omitempty"`
	TEE        uint8 `json:"tee,omitempty"`
	SNP        uint8 `json:"snp,omitempty"`
	Microcode  uint8 `json:"microcode,omitempty"`
}

// SMTMode is Policy.SMT.
type SMTMode string

const (
	// SMTForbidden requires the host to run with SMT disabled. The empty
	// string means the same.
	SMTForbidden SMTMode = "forbidden"
	// SMTAllowed accepts hosts with SMT enabled.
	SMTAllowed SMTMode = "allowed"
)

// TrustedRoot is one trusted AMD certificate chain in the format AMD's KDS
// serves at .../vcek/v1/<product>/cert_chain: two PEM certificates, the ASK
// (or, for VLEK chains, the ASVK) followed by the self-signed ARK.
type TrustedRoot struct {
	// ProductLine is Milan, Genoa or Turin.
	ProductLine string `json:"productLine"`
	// CertChain is the PEM bundle: ASK or ASVK, then ARK.
	CertChain string `json:"certChain"`
}

// TCBFromVersion decomposes a TCB_VERSION value (as in REPORTED_TCB).
// It reads the bytes go-sev-guest's kds.DecomposeTCBVersion reads (a
// test holds the two equal), so the agent, which prints its own TCB as
// a policy, need not link kds.
func TCBFromVersion(v uint64) TCB {
	return TCB{Bootloader: uint8(v), TEE: uint8(v >> 8), SNP: uint8(v >> 48), Microcode: uint8(v >> 56)}
}
