package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/yamltest"
)

// tpmRig is what the process tests here start from: a software TPM, a
// fresh directory holding the policy that admits it (its EK CA and its
// PCRs 0 and 7 as they are now) as policy.yaml, and an issuer quoting
// those PCRs, closed at cleanup.
type tpmRig struct {
	dir    string
	policy string
	iss    *tpmissuer.Issuer
}

func newTPMRig(t *testing.T) *tpmRig {
	t.Helper()
	sim := tpmtest.Start(t)
	pcrs := []int{0, 7}
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	r := &tpmRig{dir: t.TempDir()}
	r.policy = yamltest.Write(t, filepath.Join(r.dir, "policy.yaml"), map[string]any{"apiVersion": "latchkey/v1",
		"tpm": tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}})
	r.iss, err = tpmissuer.New(tpmissuer.Config{Device: sim.Device, PCRs: pcrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.iss.Close() })
	return r
}

// quiet is the logger of the test agents: their retries are not the test's output.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
