package predict

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest/tpm"
)

// Options are the artefacts and choices of one prediction.
type Options struct {
	// UKI is the unified kernel image's path (required).
	UKI string
	// BootLoaders are paths of EFI applications loaded before the UKI.
	BootLoaders []string
	// Cmdlines are command lines a boot loader passes to the UKI (PCR 12);
	// none for a UKI booted with its own .cmdline.
	Cmdlines []string
	// Phases are the boot phases to predict PCR 11 for (default
	// tpm.DefaultPCR11Phases, the phases the agent runs in).
	Phases []string
	// Stub is the systemd-stub generation inside the UKI (default 252).
	Stub Stub
	// SecureBootOff admits machines with Secure Boot off in the snippet.
	SecureBootOff bool
}

// Snippet is the part of the verifier's policy file a prediction fills.
type Snippet struct {
	APIVersion string      `json:"apiVersion"`
	TPM        *tpm.Policy `json:"tpm"`
}

// Predict reads the artefacts and returns the policy snippet a machine
// booting them passes: the UKI's and boot loaders' Authenticode digests
// (PCR 4), the command lines when some are passed (with the UKI's own, as
// every measured one must then be listed), and PCR 11 in each phase.
func Predict(o Options) (*Snippet, *UKI, error) {
	if o.UKI == "" {
		return nil, nil, fmt.Errorf("predict: no uki given")
	}
	if o.Stub == "" {
		o.Stub = Stub252
	}
	phases := o.Phases
	if len(phases) == 0 {
		phases = tpm.DefaultPCR11Phases
	}
	_, u, err := readUKIFile(o.UKI, o.Stub)
	if err != nil {
		return nil, nil, err
	}
	bp := &tpm.BootPolicy{UKIs: []string{digest(u.Authenticode)}, PCR11Phases: phases}
	bp.SecureBoot.AllowDisabled = o.SecureBootOff
	loaders, err := imageDigests(o.BootLoaders, Authenticode)
	if err != nil {
		return nil, nil, err
	}
	for _, d := range loaders {
		bp.BootLoaders = append(bp.BootLoaders, digest(d))
	}
	bp.KernelCmdlines = cmdlinesFor(u, o.Cmdlines)
	var pcr11 []string
	for _, ph := range phases {
		v := u.PCR11(ph)
		pcr11 = append(pcr11, hex.EncodeToString(v[:]))
	}
	return &Snippet{APIVersion: "latchkey/v1", TPM: &tpm.Policy{PCRs: map[int][]string{11: pcr11}, Boot: bp}}, u, nil
}

// Write prints s as YAML with a comment per predicted value.
func Write(w io.Writer, s *Snippet, u *UKI) error {
	out, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	var b strings.Builder
	b.WriteString("# latchkey-verifier policy predict: reference values of a machine booting these artefacts.\n")
	b.WriteString("# Paste into the policy's tpm section (next to its ekCARoots/ekPublicKeyHashes).\n")
	b.WriteString("# Secure Boot stays required unless --secure-boot-off: list the db certificates\n")
	b.WriteString("# under tpm.boot.secureBoot.dbCertificates. Drop pcrs.11 to admit signed upgrades\n")
	b.WriteString("# by pcr11Signers instead of these exact values.\n")
	for _, s := range u.Sections {
		fmt.Fprintf(&b, "#   uki section %-9s %d bytes\n", s.Name, len(s.Data))
	}
	b.Write(out)
	_, err = io.WriteString(w, b.String())
	return err
}

// readUKIFile reads the UKI at path and parses it.
func readUKIFile(path string, stub Stub) ([]byte, *UKI, error) {
	img, err := readImage(path)
	if err != nil {
		return nil, nil, err
	}
	u, err := ReadUKI(img, stub)
	if err != nil {
		return nil, nil, fmt.Errorf("predict: %s: %w", path, err)
	}
	return img, u, nil
}

// imageDigests reads each boot loader image and returns its Authenticode
// digest by sum (SHA-256 for a TPM's PCR 4, SHA-384 for TDX's RTMR[1]).
func imageDigests[D any](paths []string, sum func([]byte) (D, error)) ([]D, error) {
	out := make([]D, 0, len(paths))
	for _, path := range paths {
		b, err := readImage(path)
		if err != nil {
			return nil, err
		}
		d, err := sum(b)
		if err != nil {
			return nil, fmt.Errorf("predict: %s: %w", path, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// cmdlinesFor is the kernelCmdlines list for passed command lines: none
// when none is passed; else the UKI's own .cmdline (when it has one) and
// each passed one, as every measured command line must then be listed.
func cmdlinesFor(u *UKI, passed []string) []string {
	if len(passed) == 0 {
		return nil
	}
	var out []string
	if c := u.Cmdline(); c != "" {
		out = append(out, c)
	}
	return append(out, passed...)
}

func digest(d [32]byte) string { return "sha256:" + hex.EncodeToString(d[:]) }

func readImage(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("predict: %w", err)
	}
	if st.Size() > MaxImageSize {
		return nil, fmt.Errorf("predict: %s is larger than %d bytes", path, MaxImageSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("predict: %w", err)
	}
	return b, nil
}
