package issuer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/attest"
)

// ErrDevice marks a failure of the TPM itself (not of the verifier or the
// policy): out of object memory, a lockout, a device that does not answer.
// The agent reports it with its own exit code; a restart may help, since
// it flushes what a killed agent left loaded (FlushStale).
var ErrDevice = attest.ErrDevice

// maxTransient bounds how many handles one GetCapability asks for; TPMs
// have 3 to 7 transient object slots.
const maxTransient = 64

// FlushStale flushes every transient object on a TPM that has no resource
// manager (a raw /dev/tpm0 or a swtpm command port). An agent killed
// mid-attestation leaves its EK and AK loaded there, and after two such
// leaks every attestation fails with TPM_RC_OBJECT_MEMORY. At boot the
// agent is such a TPM's only user, so whatever is loaded is stale. It
// returns how many objects it flushed. Through the kernel's resource
// manager (/dev/tpmrm0) objects belong to their open file and are flushed
// with it: nothing to do.
func FlushStale(device string) (int, error) {
	if usesResourceManager(device) {
		return 0, nil
	}
	c, err := open(device)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrDevice, err)
	}
	defer c.Close()
	handles, err := transientHandles(c)
	if err != nil {
		return 0, fmt.Errorf("%w: list transient objects: %w", ErrDevice, err)
	}
	for _, h := range handles {
		if _, err := (tpm2.FlushContext{FlushHandle: h}).Execute(c); err != nil {
			return 0, fmt.Errorf("%w: flush transient object %#x: %w", ErrDevice, h, err)
		}
	}
	return len(handles), nil
}

func usesResourceManager(device string) bool {
	return device == "" || strings.HasPrefix(device, "/dev/tpmrm")
}

func transientHandles(t transport.TPM) ([]tpm2.TPMHandle, error) {
	rsp, err := tpm2.GetCapability{
		Capability:    tpm2.TPMCapHandles,
		Property:      uint32(tpm2.TPMHTTransient) << 24,
		PropertyCount: maxTransient,
	}.Execute(t)
	if err != nil {
		return nil, err
	}
	hl, err := rsp.CapabilityData.Data.Handles()
	if err != nil {
		return nil, err
	}
	var out []tpm2.TPMHandle
	for _, h := range hl.Handle {
		if uint32(h)>>24 == uint32(tpm2.TPMHTTransient) {
			out = append(out, h)
		}
	}
	return out, nil
}

// deviceError marks err as a TPM failure when the TPM answered with a
// response code that says so (out of memory, lockout, retry exhausted).
func deviceError(err error) error {
	var rc tpm2.TPMRC
	if errors.As(err, &rc) {
		switch rc {
		case tpm2.TPMRCObjectMemory, tpm2.TPMRCSessionMemory, tpm2.TPMRCMemory, tpm2.TPMRCLockout,
			tpm2.TPMRCRetry, tpm2.TPMRCYielded, tpm2.TPMRCCanceled:
			return fmt.Errorf("%w: %w", ErrDevice, err)
		}
	}
	return err
}
