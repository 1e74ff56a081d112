package load

// The verifier's own validation times: the child's log handler keeps the
// validation_ms of every accepted join's audit line, and each STATS reply
// reports the p50/p99 of those since the previous one (so a phase's
// measureCPU window gives that phase's), the figure admission control must
// leave unchanged under a storm.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// validationLog wraps the audit log's handler.
type validationLog struct {
	slog.Handler
	v *validations
}

type validations struct {
	mu sync.Mutex
	ms []float64
}

func (h validationLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "join decision" {
		var ms float64
		accepted := false
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "validation_ms":
				ms = a.Value.Float64()
			case "result":
				accepted = a.Value.String() == "accepted"
			}
			return true
		})
		if accepted {
			h.v.mu.Lock()
			h.v.ms = append(h.v.ms, ms)
			h.v.mu.Unlock()
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h validationLog) WithAttrs(as []slog.Attr) slog.Handler {
	return validationLog{Handler: h.Handler.WithAttrs(as), v: h.v}
}

func (h validationLog) WithGroup(name string) slog.Handler {
	return validationLog{Handler: h.Handler.WithGroup(name), v: h.v}
}

// take returns the count, p50 and p99 (ms) since the last take.
func (v *validations) take() (n int, p50, p99 float64) {
	v.mu.Lock()
	ms := v.ms
	v.ms = nil
	v.mu.Unlock()
	if len(ms) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ms)
	at := func(q float64) float64 { return ms[min(len(ms)-1, max(0, int(q*float64(len(ms))+0.5)-1))] }
	return len(ms), at(0.5), at(0.99)
}
