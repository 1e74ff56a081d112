//go:build linux

package main

import (
	"fmt"
	"strconv"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
)

// tpmDevice is the kernel's resource-managed TPM device, which systemd units
// share with the agent.
const tpmDevice = "/dev/tpmrm0"

// pcrEvent records data into PCR index with TPM2_PCR_Event, so the TPM hashes
// it into every allocated bank: whichever bank the verifier's policy reads,
// the tampered value differs from the golden one.
func pcrEvent(device, index, data string) error {
	pcr, err := strconv.Atoi(index)
	if err != nil || pcr < 0 || pcr > 15 {
		return fmt.Errorf("pcr index %q: want 0..15 (locality 0 can extend only those)", index)
	}
	if len(data) == 0 || len(data) > 1024 {
		return fmt.Errorf("event data must be 1..1024 bytes")
	}
	tpm, err := linuxtpm.Open(device)
	if err != nil {
		return fmt.Errorf("open %s: %w", device, err)
	}
	defer tpm.Close()
	cmd := tpm2.PCREvent{
		PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(pcr), Auth: tpm2.PasswordAuth(nil)},
		EventData: tpm2.TPM2BEvent{Buffer: []byte(data)},
	}
	if _, err := cmd.Execute(tpm); err != nil {
		return fmt.Errorf("pcr event into pcr %d: %w", pcr, err)
	}
	return nil
}
