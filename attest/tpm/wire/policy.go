package wire

// Policy holds the TPM reference values of the verifier's policy file. It
// is decoded strictly and case-sensitively (verifier/policy, through
// internal/strictyaml), hence the camelCase JSON tags. The zero value trusts nothing: without an AK pin, an EK hash or an
// EK CA, every evidence is refused as UNTRUSTED_AK.
type Policy struct {
	// PCRs maps a PCR index (0..23) to the lowercase-hex SHA-256 values it
	// may hold. Every entry is a list, so an image upgrade lists the old
	// and the new value together. A PCR not listed is not checked.
	PCRs map[int][]string `json:"pcrs,omitempty"`
	// EKCARoots are PEM certificates (one or more per entry) trusted as
	// anchors for EK certificates. The TPM stores only the leaf, so list
	// the issuing (intermediate) CA too, or only it to trust one product
	// line: every certificate listed is an anchor.
	EKCARoots []string `json:"ekCARoots,omitempty"`
	// EKPublicKeyHashes are "sha256:<hex>" of the DER SubjectPublicKeyInfo
	// of accepted EKs, for TPMs without an EK certificate (most virtual
	// TPMs). `latchkey-agent measure` prints the machine's.
	EKPublicKeyHashes []string `json:"ekPublicKeyHashes,omitempty"`
	// AKPublicKeyHashes are "sha256:<hex>" SPKI hashes of pinned AKs. A
	// pinned AK needs no EK and no credential activation.
	AKPublicKeyHashes []string `json:"akPublicKeyHashes,omitempty"`
	// Boot is the component policy, checked against the verified event
	// logs next to (not instead of) PCRs. nil checks no component and
	// needs no event log.
	Boot *BootPolicy `json:"boot,omitempty"`
}

// BootPolicy is the component policy: reference values by boot component,
// compared with the Boot the event logs verifiably describe. Every field
// is a list, so a rollout lists the old and the new component together.
// The zero value admits nothing: no boot loader, no UKI, no command line
// from outside the UKI, and Secure Boot must be on with a db the policy
// lists. `latchkey-verifier policy predict` prints the values of a UKI.
type BootPolicy struct {
	// UKIs are "sha256:<hex>" Authenticode digests of accepted UKIs (the
	// PCR 4 application systemd-stub ran from).
	UKIs []string `json:"ukis,omitempty"`
	// BootLoaders are "sha256:<hex>" Authenticode digests of accepted
	// applications loaded before the UKI (systemd-boot, shim), or of every
	// application when no systemd-stub runs.
	BootLoaders []string `json:"bootLoaders,omitempty"`
	// KernelCmdlines are accepted kernel command lines. Empty: the UKI's
	// own .cmdline is accepted with the UKI and a command line passed from
	// outside it (PCR 12) is refused. Non-empty: every measured command
	// line, built in (PCR 11 .cmdline, compared by SHA-256, with or without
	// one trailing newline or NUL) or passed (PCR 12, compared as text),
	// must be listed.
	KernelCmdlines []string `json:"kernelCmdlines,omitempty"`
	// SecureBoot is what PCR 7 must show.
	SecureBoot SecureBootPolicy `json:"secureBoot,omitempty"`
	// PCR11Signers are PEM public keys (RSA >= 2048 bits or ECDSA) whose
	// `systemd-measure sign` signatures admit a UKI not in UKIs: the
	// quoted PCR 11 must be the value a signature entry by one of these
	// keys signs, in one of PCR11Phases. An image signed by a listed key
	// is admitted with no policy edit; combine with Secure Boot (the
	// default), since PCR 11 covers the UKI's sections but not the stub.
	PCR11Signers []string `json:"pcr11Signers,omitempty"`
	// PCR11Phases are the boot phases a signed PCR 11 may be in (default
	// DefaultPCR11Phases, the phases the agent runs in), so a signature
	// meant for the initrd does not admit a machine stopped there.
	PCR11Phases []string `json:"pcr11Phases,omitempty"`
	// ExtraMeasurements are "sha256:<hex>" digests of measurements in PCR
	// 11 or 12 that the verifier cannot read (systemd-stub's credentials
	// and add-ons, anything measured there that is neither a section, a
	// phase word nor the command line) and that are accepted by digest.
	// Empty (the default): any such measurement refuses the machine.
	ExtraMeasurements []string `json:"extraMeasurements,omitempty"`
}

// SecureBootPolicy is the Secure Boot part of BootPolicy.
type SecureBootPolicy struct {
	// AllowDisabled admits machines with Secure Boot off. The zero value
	// requires it on.
	AllowDisabled bool `json:"allowDisabled,omitempty"`
	// DBCertificates are PEM certificates accepted in the Secure Boot db:
	// with Secure Boot on, every db certificate must be listed.
	DBCertificates []string `json:"dbCertificates,omitempty"`
}
