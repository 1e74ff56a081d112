package tpm_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// The real boot of testdata/ovmf-uki (README.txt there): Debian 12 OVMF,
// no Secure Boot, systemd-stub 252 UKI, initramfs-tools initrd, the agent
// in phase "sysinit". PCRs are what the agent quoted (its measure output).
const (
	realUKI    = "16fe1ad2d660969dea39905bd9eaf65cc3ecd37e5bd23e3bc8edaedc7d4dbc68"
	realKernel = "48df3aee4f7518867d5cd624da73db46d6b954bb3cde4dc5236ca9c0555c2d65"
)

func realBoot(t *testing.T) (log []byte, pcrs map[int][32]byte, cmdline string) {
	t.Helper()
	log, err := os.ReadFile("testdata/ovmf-uki/binary_bios_measurements")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("testdata/ovmf-uki/latchkey-agent-measure.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		TPM tpm.Policy `json:"tpm"`
	}
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	pcrs = map[int][32]byte{}
	for idx, v := range m.TPM.PCRs {
		b, err := hex.DecodeString(v[0])
		if err != nil || len(b) != 32 {
			t.Fatalf("pcr %d: %q", idx, v[0])
		}
		pcrs[idx] = [32]byte(b)
	}
	c, err := os.ReadFile("testdata/ovmf-uki/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	return log, pcrs, string(c)
}

// The real log replays against the quoted PCRs, and the typed state names
// what the guest booted.
func TestRealOVMFLogReplays(t *testing.T) {
	log, pcrs, cmdline := realBoot(t)
	b, err := bootlog.Verify(pcrs, log, nil)
	if err != nil {
		t.Fatalf("VerifyBoot: %v", err)
	}
	apps := fmt.Sprint(b.Applications)
	want := fmt.Sprint([]bootlog.Application{{Digest: mustHex(t, realUKI), Attempt: 1}, {Digest: mustHex(t, realKernel), Attempt: 1}})
	if apps != want {
		t.Fatalf("applications %s, want %s", apps, want)
	}
	var names []string
	for _, s := range b.UKISections {
		names = append(names, s.Name)
	}
	if strings.Join(names, " ") != ".linux .osrel .cmdline .initrd" {
		t.Fatalf("sections %v", names)
	}
	if s, _ := b.Section(".cmdline"); s.Digest != sha256.Sum256([]byte(cmdline)) {
		t.Fatalf(".cmdline digest %x is not the cmdline file's", s.Digest)
	}
	if b.SecureBoot.Enabled || !b.PhaseKnown || b.Phase != "sysinit" || b.CmdlinePassed || len(b.Unexplained) != 0 {
		t.Fatalf("secure boot %v, phase %q (%v), cmdline passed %v, unexplained %v", b.SecureBoot.Enabled, b.Phase, b.PhaseKnown, b.CmdlinePassed, b.Unexplained)
	}
}

// Through the whole validator: the real log with the real PCRs passes a
// component policy listing the real UKI and command line; the same log
// edited after the quote, truncated, or with the UKI unlisted is refused.
func TestRealOVMFLogPolicy(t *testing.T) {
	log, pcrs, cmdline := realBoot(t)
	m := &machine{ak: newCrafted(t, true), pcrs: pcrs}
	bp := &tpm.BootPolicy{UKIs: []string{"sha256:" + realUKI}, KernelCmdlines: []string{cmdline},
		SecureBoot: tpm.SecureBootPolicy{AllowDisabled: true}, PCR11Phases: []string{"sysinit"}}
	withLog := func(l []byte) func(*craftOpts) { return func(o *craftOpts) { o.fw = l } }
	if _, err := m.validate(t, bp, withLog(log)); err != nil {
		t.Fatalf("real boot refused: %v", err)
	}
	edited := bytes.Clone(log)
	uki := mustHex(t, realUKI)
	i := bytes.Index(edited, uki[:])
	edited[i] ^= 1
	_, err := m.validate(t, bp, withLog(edited))
	wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "pcr 4: firmware event log replays to ")
	_, err = m.validate(t, bp, withLog(log[:len(log)-1]))
	wantRefusal(t, err, latchkeyv1.Reason_MALFORMED, "firmware event log: ")
	other := *bp
	other.UKIs = []string{"sha256:" + realKernel}
	_, err = m.validate(t, &other, withLog(log))
	// The policy places the listed kernel as the UKI, so the real UKI
	// before it would have to be a boot loader.
	wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "boot loader sha256:"+realUKI+" in pcr 4 is not allowed")
	other.UKIs = []string{"sha256:" + strings.Repeat("ab", 32)}
	_, err = m.validate(t, &other, withLog(log))
	wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "uki sha256:"+realUKI+" in pcr 4 is not allowed")
	sbOn := *bp
	sbOn.SecureBoot.AllowDisabled = false
	_, err = m.validate(t, &sbOn, withLog(log))
	wantRefusal(t, err, latchkeyv1.Reason_SECURE_BOOT_REQUIRED, "secure boot is off (pcr 7), the policy requires it")
}

func mustHex(t *testing.T, s string) [32]byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 {
		t.Fatalf("bad hex %q", s)
	}
	return [32]byte(b)
}
