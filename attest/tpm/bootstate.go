package tpm

import (
	"crypto/sha256"
	"crypto/x509"
)

// Boot is the verified, typed view of what the event logs say was
// measured. Every field comes from an event whose PCR replayed to the quoted
// value (see verifyBoot); nothing unverified is copied. It is the input of
// the component policy and what `latchkey-agent measure` prints.
type Boot struct {
	// Firmware is the platform firmware's S-CRTM version string (PCR 0;
	// OVMF logs an empty one).
	Firmware string
	// FirmwareBlobs are the digests of the firmware volumes measured into
	// PCR 0 (EV_EFI_PLATFORM_FIRMWARE_BLOB, BLOB2), in log order.
	FirmwareBlobs [][sha256.Size]byte
	// SecureBoot is the Secure Boot state and databases (PCR 7).
	SecureBoot SecureBoot
	// Applications are the EFI boot applications in load order (PCR 4,
	// EV_EFI_BOOT_SERVICES_APPLICATION): boot loaders, the UKI, and what
	// the UKI loads itself.
	Applications []Application
	// UKISections are the sections systemd-stub measured into PCR 11, in
	// measurement order; empty when no systemd-stub ran.
	UKISections []UKISection
	// Cmdline is the kernel command line a boot loader passed to
	// systemd-stub (PCR 12, as text); empty when none was passed.
	Cmdline string
	// CmdlinePassed is true when Cmdline was measured (even if empty).
	CmdlinePassed bool
	// Phase is the systemd boot phase PCR 11 is in, the phase words
	// joined by ':' ("enter-initrd:leave-initrd:sysinit"), "" before the
	// first one. PhaseKnown is false when PCR 11 is not in the logs.
	Phase      string
	PhaseKnown bool
	// Systemd are systemd's userspace measurements (tpm2-measure.log) and
	// systemd-stub's PCR 12/13 measurements other than the command line.
	Systemd []SystemdEvent
}

// SecureBoot is the verified Secure Boot configuration.
type SecureBoot struct {
	Enabled bool
	// PK, KEK, DB and DBX are the certificates of the databases measured
	// before the PCR 7 separator; the Hashes fields their hash entries.
	PK, KEK, DB, DBX    []*x509.Certificate
	DBHashes, DBXHashes [][]byte
	PKHashes, KEKHashes [][]byte
	// Authorities are the certificates that verified the loaded images
	// (EV_EFI_VARIABLE_AUTHORITY after the separator).
	Authorities []*x509.Certificate
}

// Application is one EFI boot application.
type Application struct {
	// Digest is the PE image's Authenticode SHA-256 digest.
	Digest [sha256.Size]byte
	// Role says what it is in the boot chain.
	Role AppRole
}

// AppRole classifies a boot application by its place in the chain.
type AppRole string

const (
	// RoleBootLoader: an application before the UKI (shim, systemd-boot),
	// or every application when no systemd-stub ran.
	RoleBootLoader AppRole = "boot loader"
	// RoleUKI: the last application loaded before systemd-stub measured
	// its sections into PCR 11.
	RoleUKI AppRole = "uki"
	// RoleUKIPayload: an application loaded after the UKI's stub started
	// (newer systemd-stub loads the embedded kernel with LoadImage); its
	// bytes are part of the UKI and covered by the UKI's digest.
	RoleUKIPayload AppRole = "uki payload"
)

// UKISection is one systemd-stub PCR 11 measurement.
type UKISection struct {
	// Name is the PE section name (".linux", ".cmdline", …).
	Name string
	// Digest is SHA-256 of the section's contents.
	Digest [sha256.Size]byte
}

// SystemdEvent is one systemd measurement outside the UKI's sections.
type SystemdEvent struct {
	PCR int
	// Type is systemd's eventType ("phase", "volume-key", "filesystem",
	// "machine-id", …) or, for systemd-stub events, "stub".
	Type string
	// Content is the measured string when the digest proves it (phases,
	// machine id, file systems, volume names); otherwise the
	// description the log gives, marked by ContentVerified false.
	Content         string
	ContentVerified bool
	Digest          [sha256.Size]byte
}

// UKI returns the application systemd-stub ran from, if any.
func (b *Boot) UKI() (Application, bool) {
	for _, a := range b.Applications {
		if a.Role == RoleUKI {
			return a, true
		}
	}
	return Application{}, false
}

// Section returns the UKI section called name, if measured.
func (b *Boot) Section(name string) (UKISection, bool) {
	for _, s := range b.UKISections {
		if s.Name == name {
			return s, true
		}
	}
	return UKISection{}, false
}
