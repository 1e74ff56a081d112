package app

import (
	"context"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/tpm"
)

// snippet is the shape of the verifier's policy file, so measure's output
// pastes into it as it is.
type snippet struct {
	APIVersion string      `json:"apiVersion"`
	TPM        *tpm.Policy `json:"tpm,omitempty"`
	SNP        *snp.Policy `json:"snp,omitempty"`
}

// Measure writes the machine's current reference values as a policy
// snippet an image builder can paste into the verifier's policy.
func Measure(ctx context.Context, cfg *config.Config, w io.Writer) error {
	s := snippet{APIVersion: "latchkey/v1"}
	var err error
	v := variant(cfg)
	if v == "snp" {
		s.SNP, err = snp.Measure(ctx, snp.IssuerConfig{})
	} else {
		s.TPM, err = tpm.Measure(ctx, cfg.TPM.Device, cfg.TPM.PCRs)
	}
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	out, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	_, err = fmt.Fprintf(w, "# latchkey reference values of this machine (%s); paste into the verifier policy\n%s", v, out)
	return err
}
