package app

import (
	"context"
	"fmt"
	"io"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/agent/join"
	"github.com/latchkey/latchkey/internal/execx"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// kubeadmJoin adapts the join stage to the boot's Joiner.
type kubeadmJoin struct {
	j         *join.Joiner
	node      string
	role      latchkeyv1.Role
	printOnly bool
	out       io.Writer
}

// newJoiner returns nil (no join) when the config disables joining.
func newJoiner(cfg *config.Config, deps Deps) (boot.Joiner, error) {
	if cfg.Join.Disabled {
		return nil, nil
	}
	j, err := join.New(join.Config{Runner: execx.New(execx.Config{Logger: deps.Logger}), Logger: deps.Logger,
		Kubeadm: cfg.Join.Kubeadm, DiscoveryTimeout: cfg.Join.DiscoveryTimeout.Duration, DryRun: cfg.Join.KubeadmDryRun,
		IgnorePreflightErrors: cfg.Join.IgnorePreflightErrors, CRISocket: cfg.Join.CRISocket, CRIWait: cfg.Join.CRIWait.Duration})
	if err != nil {
		return nil, err
	}
	return &kubeadmJoin{j: j, node: cfg.NodeName, role: role(cfg.Role), printOnly: cfg.Join.DryRun, out: deps.Stdout}, nil
}

// joinAttempts is how often the boot tries to join: printing the
// configuration is not retried, since a fresh ticket would not change
// why it failed.
func joinAttempts(cfg *config.Config) int {
	if cfg.Join.DryRun {
		return 1
	}
	return boot.DefaultJoinAttempts
}

// Join makes one attempt: it prints the redacted configuration in
// dry-run mode, and runs kubeadm otherwise.
func (k *kubeadmJoin) Join(ctx context.Context, t *latchkeyv1.Ticket) error {
	if k.printOnly {
		y, err := k.j.RenderRedacted(join.TicketFrom(k.node, k.role, t))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(k.out, "# kubeadm JoinConfiguration (dry run, secrets redacted)\n%s", y)
		return err
	}
	return k.j.Join(ctx, join.TicketFrom(k.node, k.role, t))
}
