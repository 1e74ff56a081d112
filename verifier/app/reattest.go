package app

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/reattest"
)

// validateReattest checks the reattest section.
func (c *Config) validateReattest() error {
	r := c.Reattest
	if d := r.Deadline.Duration; d != 0 && d < time.Second {
		return fmt.Errorf("reattest.deadline %s is below 1s", d)
	}
	if d := r.Resync.Duration; d != 0 && d < 100*time.Millisecond {
		return fmt.Errorf("reattest.resync %s is below 100ms", d)
	}
	for _, kv := range [][2]string{{"effect", r.Effect}, {"offlineEffect", r.OfflineEffect}} {
		key, e := kv[0], kv[1]
		switch e {
		case "", reattest.EffectNoSchedule, reattest.EffectNoExecute, reattest.EffectNone:
		default:
			return fmt.Errorf("reattest.%s %q: want NoSchedule, NoExecute or none", key, e)
		}
	}
	return nil
}

// runReattest runs the taint controller (it leads only on one replica)
// until ctx ends, over the nodes' binding Leases.
func (v *Verifier) runReattest(ctx context.Context, leases *binding.Leases) {
	host, _ := os.Hostname()
	c, err := reattest.New(reattest.Config{Client: v.kube, Statuses: leases,
		Namespace: v.cfg.Kubernetes.BindingNamespace, Identity: fmt.Sprintf("%s_%d_%08x", host, os.Getpid(), rand.Uint32()),
		Deadline: v.cfg.Reattest.Deadline.Duration, Effect: v.cfg.Reattest.Effect,
		OfflineEffect: v.cfg.Reattest.OfflineEffect, Resync: v.cfg.Reattest.Resync.Duration,
		Metrics: v.metrics, Logger: v.deps.Logger})
	if err != nil {
		v.deps.Logger.Error("re-attestation controller not started", logkey.Error, err.Error())
		return
	}
	c.Run(ctx)
	v.deps.Logger.Log(ctx, slog.LevelInfo, "re-attestation controller stopped")
}
