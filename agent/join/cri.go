package join

import (
	"context"
	"fmt"
	"github.com/latchkey/latchkey/internal/logkey"
	"net"
	"strings"
	"time"
)

// DefaultCRIWait bounds the wait for the container runtime's socket.
const DefaultCRIWait = 2 * time.Minute

// criPoll is how often waitCRI tries the socket.
const criPoll = 250 * time.Millisecond

// waitCRI waits until the configured CRI socket accepts a connection, so
// kubeadm's preflight does not race the runtime's start: latchkey orders
// containerd after the agent's READY (containerd.service.d/50-latchkey.conf,
// it keeps its state on the state disk), and the join follows READY at
// once. Nothing to wait for without a unix:// CRISocket or in a dry run
// (which starts nothing).
func (j *Joiner) waitCRI(ctx context.Context) error {
	path, ok := strings.CutPrefix(j.cfg.CRISocket, "unix://")
	if j.cfg.DryRun || !ok || path == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, j.cfg.CRIWait)
	defer cancel()
	start := time.Now()
	var d net.Dialer
	for logged := false; ; {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			_ = c.Close()
			if logged {
				j.log.Info("container runtime is listening", logkey.Socket, j.cfg.CRISocket, logkey.Waited, time.Since(start).Round(time.Millisecond).String())
			}
			return nil
		}
		if !logged {
			j.log.Info("waiting for the container runtime", logkey.Socket, j.cfg.CRISocket, logkey.Timeout, j.cfg.CRIWait.String())
			logged = true
		}
		t := time.NewTimer(criPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("join: container runtime %s not listening after %s: %w", j.cfg.CRISocket, j.cfg.CRIWait, err)
		case <-t.C:
		}
	}
}
