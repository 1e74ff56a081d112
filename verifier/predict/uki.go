package predict

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/latchkey/latchkey/attest/tpm/bootlog"
)

// Stub names a systemd-stub generation by the sections it measures into
// PCR 11, in the order it measures them (its UnifiedSection enum, not the
// order in the file). .pcrsig is never measured: it holds the signature of
// the measurement.
type Stub string

const (
	// Stub252 is systemd 252 (Debian 12): .linux .osrel .cmdline .initrd
	// .splash .dtb .pcrpkey.
	Stub252 Stub = "252"
	// Stub254 is systemd 254 and newer, which added .uname and .sbat.
	Stub254 Stub = "254"
)

var stubSections = map[Stub][]string{
	Stub252: {".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrpkey"},
	Stub254: {".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".uname", ".sbat", ".pcrpkey"},
}

// Section is a UKI section as systemd-stub measures it.
type Section struct {
	Name string
	// Data is what the stub hashes: VirtualSize bytes of the loaded
	// section (its raw data, zero-padded when VirtualSize is larger).
	Data []byte
}

// UKI is what predict reads from a unified kernel image.
type UKI struct {
	// Authenticode is the PCR 4 digest of the whole image.
	Authenticode [sha256.Size]byte
	// Sections are the measured sections in measurement order.
	Sections []Section
}

// ReadUKI parses a UKI and lists the sections stub measures. It refuses an
// image without .linux (not a UKI) or with a measured section twice (the
// stub would measure only the first; a predicted value could not match).
func ReadUKI(image []byte, stub Stub) (*UKI, error) {
	order, ok := stubSections[stub]
	if !ok {
		return nil, fmt.Errorf("unknown systemd-stub generation %q (want 252 or 254)", stub)
	}
	p, err := parsePE(image)
	if err != nil {
		return nil, err
	}
	digest, err := Authenticode(image)
	if err != nil {
		return nil, err
	}
	found := map[string]Section{}
	for _, s := range p.sections {
		if !contains(order, s.name) {
			continue
		}
		if _, dup := found[s.name]; dup {
			return nil, fmt.Errorf("section %s appears twice", s.name)
		}
		data := make([]byte, s.virtualSize)
		copy(data, image[s.rawOff:s.rawOff+min(s.rawSize, s.virtualSize)])
		found[s.name] = Section{Name: s.name, Data: data}
	}
	if _, ok := found[".linux"]; !ok {
		return nil, fmt.Errorf("no .linux section: not a unified kernel image")
	}
	u := &UKI{Authenticode: digest}
	for _, name := range order {
		if s, ok := found[name]; ok {
			u.Sections = append(u.Sections, s)
		}
	}
	return u, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// StubPCR11 is PCR 11 after systemd-stub measured the sections (from a
// zeroed PCR): for each, SHA-256 of its name with NUL, then of its data.
func (u *UKI) StubPCR11() [sha256.Size]byte {
	var v [sha256.Size]byte
	for _, s := range u.Sections {
		v = bootlog.Extend(v, sha256.Sum256(append([]byte(s.Name), 0)))
		v = bootlog.Extend(v, sha256.Sum256(s.Data))
	}
	return v
}

// PCR11 is PCR 11 in phase (':'-separated words, "" right after the stub).
func (u *UKI) PCR11(phase string) [sha256.Size]byte {
	return bootlog.ExtendPhase(u.StubPCR11(), phase)
}

// Cmdline is the UKI's built-in command line (.cmdline without trailing
// newlines and NULs), "" when it has none.
func (u *UKI) Cmdline() string {
	for _, s := range u.Sections {
		if s.Name == ".cmdline" {
			return strings.TrimRight(string(s.Data), "\n\x00")
		}
	}
	return ""
}
