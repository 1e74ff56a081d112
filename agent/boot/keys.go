package boot

import (
	"context"

	"github.com/latchkey/latchkey/agent/disk"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// openWithKeys hands the disk stage every key of the ticket, so it can
// rewrap (docs/operations.md, "Rotating the master secret"), and clears
// the previous-generation key afterwards (the caller clears the current
// one).
func openWithKeys(ctx context.Context, stage disk.Stage, plan disk.Plan, t *latchkeyv1.Ticket) (disk.Result, error) {
	defer clear(t.GetPreviousDiskKey())
	return stage.Open(ctx, plan, disk.Keys{Current: t.GetDiskKey(), Generation: t.GetKeyGeneration(),
		Previous: t.GetPreviousDiskKey(), PreviousGeneration: t.GetPreviousKeyGeneration()})
}
