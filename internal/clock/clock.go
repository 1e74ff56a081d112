// Package clock holds the small time helpers every stage injects, so a
// test can replace waiting with a fake and production code waits the same
// way everywhere.
package clock

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx ends, whichever comes first; it returns
// ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
