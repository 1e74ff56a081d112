package app

import (
	"context"
	"fmt"
	"io"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/agent/disk"
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
		IgnorePreflightErrors: cfg.Join.IgnorePreflightErrors})
	if err != nil {
		return nil, err
	}
	return &kubeadmJoin{j: j, node: cfg.NodeName, role: role(cfg.Role), printOnly: cfg.Join.DryRun, out: deps.Stdout}, nil
}

// Join prints the redacted configuration in dry-run mode; otherwise it
// runs kubeadm, retrying with fresh tickets.
func (k *kubeadmJoin) Join(ctx context.Context, first *latchkeyv1.Ticket, fetch func(context.Context) (*latchkeyv1.Ticket, error)) error {
	if k.printOnly {
		y, err := k.j.RenderRedacted(join.TicketFrom(k.node, k.role, first))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(k.out, "# kubeadm JoinConfiguration (dry run, secrets redacted)\n%s", y)
		return err
	}
	used := false
	next := func(ctx context.Context) (join.Ticket, error) {
		t := first
		if used {
			var err error
			if t, err = fetch(ctx); err != nil {
				return join.Ticket{}, err
			}
		}
		used = true
		return join.TicketFrom(k.node, k.role, t), nil
	}
	return k.j.Run(ctx, next, disk.Result{})
}
