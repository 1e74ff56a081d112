package tpm_test

import (
	"fmt"
	"testing"

	"github.com/latchkey/latchkey/attest/tpm"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// PCR 11 after the boot's last phase: the join quotes "sysinit", every
// re-attestation after the boot (and a restart of the agent) quotes
// "sysinit:ready", and the default phases admit both; a machine shutting
// down has measured one more phase word and is refused, with the same
// signed image (what a node controls: the phases it reaches; what it
// cannot: the signature over another value).
func TestPCR11AfterReady(t *testing.T) {
	der, pemText := dbCert(t, "test db")
	sg := newSigner(t)
	signed := &tpm.BootPolicy{BootLoaders: []string{dgst(loaderDigest)}, PCR11Signers: []string{sg.pem},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	for _, ph := range []string{sysinit, sysinit + ":ready", "sysinit", "sysinit:ready"} {
		m := boot(t, ukiBoot(t, der), ph)
		m.sig = sg.sign(t, m.pcrs[11])
		if _, err := m.validate(t, signed, nil); err != nil {
			t.Errorf("phase %q refused: %v", ph, err)
		}
	}
	down := boot(t, ukiBoot(t, der), sysinit+":ready:shutdown")
	down.sig = sg.sign(t, down.pcrs[11])
	_, err := down.validate(t, signed, nil)
	wantRefusal(t, err, latchkeyv1.Reason_PCR_SIGNATURE_INVALID, fmt.Sprintf(
		`uki %s: pcr 11 is in boot phase "enter-initrd:leave-initrd:sysinit:ready:shutdown", the policy accepts ["enter-initrd:leave-initrd:sysinit" "enter-initrd:leave-initrd:sysinit:ready" "sysinit" "sysinit:ready"]`,
		dgst(ukiDigest)))
}
