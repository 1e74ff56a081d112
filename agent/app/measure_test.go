package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// `latchkey-agent measure` on a machine with a firmware log prints the
// component view and the component policy next to the raw PCRs.
func TestMeasurePrintsComponentView(t *testing.T) {
	sim := tpmtest.StartFresh(t)
	uki := sha256.Sum256([]byte("uki"))
	l := tpmtest.OVMFLog(tpmtest.Boot{Firmware: "EDK II", UKI: uki, Sections: []tpmtest.Section{
		{Name: ".linux", Data: []byte("kernel")}, {Name: ".cmdline", Data: []byte("ro")}}})
	l.Measure(t, sim)
	sim.Extend(t, 11, []byte("sysinit"))
	log := filepath.Join(t.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(log, l.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Variant: "tpm", TPM: config.TPMConfig{Device: sim.Device, FirmwareEventLog: log, SystemdEventLog: "-", PCRSignature: "-"}}
	var out bytes.Buffer
	if err := Measure(context.Background(), cfg, &out); err != nil {
		t.Fatalf("Measure: %v", err)
	}
	y := out.String()
	for _, want := range []string{
		"# component view", "#   uki             sha256:" + hexOf(uki) + " (pcr 4, boot attempt 1)",
		"#   uki .cmdline", `#   boot phase      "sysinit" (pcr 11)`,
		"    ukis:\n    - sha256:" + hexOf(uki), "allowDisabled: true", "ekPublicKeyHashes:",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("measure output lacks %q:\n%s", want, y)
		}
	}
}

func hexOf(d [32]byte) string { return hex.EncodeToString(d[:]) }
