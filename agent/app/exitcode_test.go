package app

import (
	"errors"
	"fmt"
	"testing"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func TestExitCode(t *testing.T) {
	refused := &ticket.RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH}
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"ok", nil, exitcode.OK},
		{"policy refusal", fmt.Errorf("gave up: %w", refused), exitcode.RefusedByPolicy},
		{"transient refusal at the end", fmt.Errorf("%w: %w", ticket.ErrUnreachable, &ticket.RefusedError{Reason: latchkeyv1.Reason_UNAVAILABLE}),
			exitcode.VerifierUnreachable},
		{"unreachable", fmt.Errorf("%w after 10m", ticket.ErrUnreachable), exitcode.VerifierUnreachable},
		{"wrong pin", fmt.Errorf("gave up: v:1: %w", atls.ErrPinMismatch), exitcode.VerifierNotAuthenticated},
		{"stopped", fmt.Errorf("%w before a ticket arrived", ticket.ErrStopped), exitcode.Stopped},
		{"disk", &boot.StageError{Stage: boot.StageDisk, Err: errors.New("foreign data")}, exitcode.DiskRefused},
		{"disk: header written, then open failed", &boot.StageError{Stage: boot.StageDisk, Err: fmt.Errorf("%w: %w", disk.ErrHeaderWritten, errors.New("mkfs failed"))},
			exitcode.DiskOpenFailed},
		{"disk: refused, nothing written", &boot.StageError{Stage: boot.StageDisk, Err: fmt.Errorf("%w: no device-mapper", disk.ErrUnusable)}, exitcode.DiskRefused},
		{"join", &boot.StageError{Stage: boot.StageJoin, Err: errors.New("kubeadm")}, exitcode.KubeadmFailed},
		{"tpm device", fmt.Errorf("evidence device failed: %w", attest.ErrDevice), exitcode.DeviceFailed},
		{"anything else", errors.New("bug"), exitcode.Internal},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("%s: ExitCode = %d (%s), want %d (%s)", tc.name, got, exitcode.Name(got), tc.want, exitcode.Name(tc.want))
		}
	}
}
