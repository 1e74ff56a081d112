package app

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/latchkey/latchkey/internal/strictyaml"

	"github.com/latchkey/latchkey/agent/config"
	snpissuer "github.com/latchkey/latchkey/attest/snp/issuer"
	snpwire "github.com/latchkey/latchkey/attest/snp/wire"
	tdxissuer "github.com/latchkey/latchkey/attest/tdx/issuer"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	tpmwire "github.com/latchkey/latchkey/attest/tpm/wire"
)

// snippet is the shape of the verifier's policy file, so measure's output
// pastes into it as it is.
type snippet struct {
	APIVersion string          `json:"apiVersion"`
	TPM        *tpmwire.Policy `json:"tpm,omitempty"`
	SNP        *snpwire.Policy `json:"snp,omitempty"`
	// TDX has the tdx section's fields; the agent does not link the
	// verifier's TDX validator.
	TDX *tdxissuer.Values `json:"tdx,omitempty"`
}

// Measure writes the machine's current reference values as a policy
// snippet an image builder can paste into the verifier's policy.
func Measure(ctx context.Context, cfg *config.Config, w io.Writer) error {
	s := snippet{APIVersion: "latchkey/v1"}
	var err error
	v := variant(cfg)
	var view string
	switch v {
	case "snp":
		s.SNP, err = snpissuer.Measure(ctx, snpissuer.Config{})
	case "tdx":
		s.TDX, err = tdxissuer.Measure(tdxissuer.Config{})
	default:
		s.TPM, view, err = measureTPM(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	out, err := strictyaml.Marshal(s)
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	_, err = fmt.Fprintf(w, "# latchkey reference values of this machine (%s); paste into the verifier policy\n%s%s", v, view, markMachineSpecific(out))
	return err
}

// machineSpecific are the keys whose values belong to this one machine,
// not to the image: pasted into a fleet policy they admit this machine
// alone.
var machineSpecific = map[string]string{
	"ekPublicKeyHashes:": "this machine's EK only: for a fleet, trust the EK CA (ekCARoots) instead",
	"akPublicKeyHashes:": "this machine's AK only",
}

// markMachineSpecific adds a comment above each machine-specific key.
func markMachineSpecific(out []byte) []byte {
	var b strings.Builder
	for _, line := range strings.SplitAfter(string(out), "\n") {
		if why, ok := machineSpecific[strings.TrimSpace(line)]; ok {
			indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
			b.WriteString(indent + "# machine-specific: " + why + "\n")
		}
		b.WriteString(line)
	}
	return []byte(b.String())
}

// measureTPM is the raw PCR policy plus, when the machine has an event
// log, the component policy and a commented component view, so an
// operator sees which component differs from the policy.
func measureTPM(ctx context.Context, cfg *config.Config) (*tpmwire.Policy, string, error) {
	p, err := tpmissuer.Measure(ctx, cfg.TPM.Device, cfg.TPM.PCRs)
	if err != nil {
		return nil, "", err
	}
	b, bp, err := tpmissuer.MeasureBoot(ctx, cfg.TPM.Device, tpmLogs(cfg))
	if err != nil {
		return nil, "", err
	}
	if b == nil {
		return p, "# no firmware event log: no component view\n", nil
	}
	p.Boot = bp
	return p, componentView(b, bp), nil
}

// componentView prints b as comment lines, one component a line.
func componentView(b *bootlog.Boot, bp *tpmwire.BootPolicy) string {
	var sb strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&sb, "#   "+format+"\n", args...) }
	sb.WriteString("# component view (event logs replayed against this TPM's PCRs):\n")
	line("secure boot     %v, %d db certificate(s), %d dbx entries (pcr 7)", b.SecureBoot.Enabled, len(b.SecureBoot.DB), len(b.SecureBoot.DBX)+len(b.SecureBoot.DBXHashes))
	for _, a := range b.Applications {
		line("%-15s sha256:%x (pcr 4, boot attempt %d)", appRole(bp, a), a.Digest, a.Attempt)
	}
	for _, s := range b.UKISections {
		line("uki %-11s sha256:%x (pcr 11)", s.Name, s.Digest)
	}
	if b.CmdlinePassed {
		line("cmdline         %q (pcr 12)", b.Cmdline)
	}
	if b.PhaseKnown {
		line("boot phase      %q (pcr 11)", b.Phase)
	}
	for _, m := range b.Unexplained {
		line("unexplained     sha256:%x (pcr %d, measurement %d)", m.Digest, m.PCR, m.Index)
	}
	return sb.String()
}

// appRole names what the component policy takes a for.
func appRole(bp *tpmwire.BootPolicy, a bootlog.Application) string {
	d := fmt.Sprintf("sha256:%x", a.Digest)
	switch {
	case slices.Contains(bp.UKIs, d):
		return "uki"
	case slices.Contains(bp.BootLoaders, d):
		return "boot loader"
	}
	return "uki payload"
}
