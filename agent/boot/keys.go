package boot

import (
	"context"

	"github.com/latchkey/latchkey/agent/disk"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// openWithKeys hands the disk stage every key of the ticket when it can
// rewrap (docs/operations.md, "Rotating the master secret"), else the
// current key alone, and clears the previous-generation key afterwards
// (the caller clears the current one).
func openWithKeys(ctx context.Context, stage disk.Stage, plan disk.Plan, t *latchkeyv1.Ticket) (disk.Result, error) {
	defer clear(t.GetPreviousDiskKey())
	ks, ok := stage.(disk.KeyedStage)
	if !ok {
		return stage.Open(ctx, plan, t.GetDiskKey())
	}
	return ks.OpenKeys(ctx, plan, disk.Keys{Current: t.GetDiskKey(), Generation: t.GetKeyGeneration(),
		Previous: t.GetPreviousDiskKey(), PreviousGeneration: t.GetPreviousKeyGeneration()})
}
