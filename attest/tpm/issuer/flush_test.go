package issuer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// A killed agent leaves objects loaded on a TPM without a resource
// manager; once its slots are full, attesting fails as a device error
// (not "no verifier reachable"), and FlushStale at the next start frees
// them so attesting works again.
func TestFlushStaleRecoversFromLeakedObjects(t *testing.T) {
	sim := tpmtest.Start(t)
	leak(t, sim.Device)
	iss, err := issuer.New(issuer.Config{Device: sim.Device, PCRs: []int{0}, Logs: issuer.LogPaths{FirmwareEventLog: "-", SystemdEventLog: "-", PCRSignature: "-"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = iss.Attest(context.Background(), make([]byte, 32))
	if !errors.Is(err, attest.ErrDevice) || !errors.Is(err, tpm2.TPMRCObjectMemory) {
		t.Fatalf("attest on a full TPM: %v, want a device error (TPM_RC_OBJECT_MEMORY)", err)
	}
	n, err := issuer.FlushStale(sim.Device)
	if err != nil || n < 3 {
		t.Fatalf("FlushStale flushed %d objects, err %v; want the leaked ones", n, err)
	}
	a, err := iss.Attest(context.Background(), make([]byte, 32))
	if err != nil {
		t.Fatalf("attest after the flush: %v", err)
	}
	a.Close()
	if n, err := issuer.FlushStale(sim.Device); err != nil || n != 0 {
		t.Fatalf("a second flush found %d objects (err %v): the attestation leaked", n, err)
	}
}

func TestFlushStaleLeavesTheResourceManagerAlone(t *testing.T) {
	if n, err := issuer.FlushStale("/dev/tpmrm0"); n != 0 || err != nil {
		t.Fatalf("FlushStale(/dev/tpmrm0) = %d, %v", n, err)
	}
}

// leak fills the TPM's transient slots the way killed agents do: primary
// keys created on connections that go away without flushing them.
func leak(t *testing.T, device string) {
	t.Helper()
	for i := 0; ; i++ {
		c, err := issuer.OpenDevice(device)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHOwner, InPublic: tpm2.New2B(tpm2.ECCSRKTemplate)}.Execute(c)
		c.Close()
		if errors.Is(err, tpm2.TPMRCObjectMemory) {
			return
		}
		if err != nil {
			t.Fatalf("create primary %d: %v", i, err)
		}
		if i > 16 {
			t.Fatal("the TPM never ran out of object memory")
		}
	}
}
