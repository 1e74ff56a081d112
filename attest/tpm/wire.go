package tpm

import (
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	"github.com/latchkey/latchkey/attest/tpm/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// The policy document and the evidence's limits live in attest/tpm/wire
// and the event-log replay in attest/tpm/bootlog, which the agent links
// too (its measure command prints a policy and replays its own logs);
// these names keep the validator reading in its own terms.
type (
	// Policy is the policy document's tpm section (wire.Policy).
	Policy = wire.Policy
	// BootPolicy is its component policy (wire.BootPolicy).
	BootPolicy = wire.BootPolicy
	// SecureBootPolicy is BootPolicy's Secure Boot part.
	SecureBootPolicy = wire.SecureBootPolicy
	// Boot is the verified view of the event logs (bootlog.Boot).
	Boot = bootlog.Boot
	// Application is a boot application in PCR 4 (bootlog.Application).
	Application = bootlog.Application
)

const (
	maxStructSize          = wire.MaxStructSize
	maxPCR                 = wire.MaxPCR
	secretSize             = wire.SecretSize
	maxPCRSignatureEntries = wire.MaxPCRSignatureEntries
	bindingSize            = attest.BindingSize
	pcrKernel              = bootlog.PCRKernel
)

// verifyBoot is Verify's replay step (bootlog.Replay).
func verifyBoot(pcrs map[int][]byte, fwLog, sdLog []byte) (*Boot, error) {
	return bootlog.Replay(pcrs, fwLog, sdLog)
}

// mismatch is an EVENT_LOG_MISMATCH refusal.
func mismatch(format string, args ...any) error {
	return attest.Refuse(latchkeyv1.Reason_EVENT_LOG_MISMATCH, format, args...)
}
