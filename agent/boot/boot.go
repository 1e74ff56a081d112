// Package boot runs the agent's stages in order at every boot: prepare the
// state disk (which UUID, first boot or rejoin), get a ticket, open the
// disk with the ticket's key, and join Kubernetes unless the node already
// holds kubelet credentials. It produces the node specified or no node at
// all: any stage failing stops the boot with a *StageError naming it.
//
// Boot is the only owner of the decisions between stages: whether the node
// has joined already (the disk stage reports kubelet credentials, the join
// stage never asks), and how often a failed join is retried, each time
// with a fresh ticket. The stages know nothing of each other.
package boot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/internal/clock"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Stage names, as StageError and STATUS= lines report them.
const (
	StageDisk   = "disk"
	StageTicket = "ticket"
	StageJoin   = "join"
)

// Progress is where a boot stands, reported through Config.OnProgress.
type Progress int

// The boot's progress, in order.
const (
	// PreparingDisk: finding the state disk and reading its header.
	PreparingDisk Progress = iota + 1
	// Attesting: making evidence and talking to verifiers.
	Attesting
	// OpeningDisk: formatting or unlocking, mounting.
	OpeningDisk
	// DiskOpen: the state disk is open and mounted. The agent tells
	// systemd READY=1 here, before kubeadm join: kubeadm restarts kubelet,
	// which is ordered after the agent, so a READY sent after the join
	// would deadlock the boot.
	DiskOpen
	// Joining: running kubeadm join.
	Joining
	// Done: nothing left to do.
	Done
)

// StageError is a boot that stopped in a stage.
type StageError struct {
	Stage string
	Err   error
}

func (e *StageError) Error() string { return e.Stage + " stage: " + e.Err.Error() }
func (e *StageError) Unwrap() error { return e.Err }

// Tickets fetches tickets (ticket.Client).
type Tickets interface {
	Get(ctx context.Context, req ticket.Request) (*latchkeyv1.Ticket, error)
}

// Joiner makes one attempt to join the cluster with t, which carries a
// bootstrap token; a failed attempt leaves the node clean for the next.
type Joiner interface {
	Join(ctx context.Context, t *latchkeyv1.Ticket) error
}

// Defaults of Config.
const (
	DefaultJoinAttempts   = 3
	DefaultJoinRetryDelay = 5 * time.Second
)

// Config wires the stages.
type Config struct {
	NodeName string
	Role     latchkeyv1.Role
	Disk     disk.Stage
	Tickets  Tickets
	// Joiner is nil when the node does not join Kubernetes.
	Joiner Joiner
	// JoinAttempts bounds the join attempts; every attempt after the
	// first takes a fresh ticket (the previous token may be spent or
	// expired). DefaultJoinAttempts when zero.
	JoinAttempts int
	// JoinRetryDelay is the pause between join attempts;
	// DefaultJoinRetryDelay when zero.
	JoinRetryDelay time.Duration
	// Sleep waits between join attempts; clock.Sleep when nil.
	Sleep func(ctx context.Context, d time.Duration) error

	Logger *slog.Logger
	// OnProgress is told where the boot stands, with a line for humans
	// (STATUS=, the status API); optional.
	OnProgress func(p Progress, line string)
	// OnPlan is told what the disk stage found, and again once the disk
	// is open with the generation it is keyed under now; optional.
	OnPlan func(disk.Plan)
	// Offline turns offline unlock on (offline.go); nil: off.
	Offline *Offline
}

// Boot is one boot of the agent.
type Boot struct {
	cfg Config
	off *offline
}

// New checks cfg.
func New(cfg Config) (*Boot, error) {
	if cfg.Disk == nil || cfg.Tickets == nil {
		return nil, errors.New("boot: disk and ticket stages are required")
	}
	if cfg.JoinAttempts < 0 || cfg.JoinRetryDelay < 0 {
		return nil, errors.New("boot: negative join attempts or retry delay")
	}
	if cfg.JoinAttempts == 0 {
		cfg.JoinAttempts = DefaultJoinAttempts
	}
	if cfg.JoinRetryDelay == 0 {
		cfg.JoinRetryDelay = DefaultJoinRetryDelay
	}
	if cfg.Sleep == nil {
		cfg.Sleep = clock.Sleep
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OnProgress == nil {
		cfg.OnProgress = func(Progress, string) {}
	}
	b := &Boot{cfg: cfg}
	if o := cfg.Offline; o != nil {
		if _, ok := cfg.Tickets.(WindowTickets); !ok || o.Sealer == nil || o.Store == nil || o.After <= 0 {
			return nil, errors.New("boot: offline unlock needs a sealer, a token store, a positive wait and a windowed ticket client")
		}
		b.off = &offline{cfg: o}
	}
	return b, nil
}

// Run runs every stage once.
func (b *Boot) Run(ctx context.Context) error {
	b.cfg.OnProgress(PreparingDisk, "inspecting state disk")
	plan, err := b.cfg.Disk.Prepare(ctx)
	if err != nil {
		return &StageError{StageDisk, err}
	}
	b.cfg.Logger.Info("state disk inspected", logkey.DiskUUID, plan.UUID, logkey.Rejoin, plan.Rejoin)
	if b.cfg.OnPlan != nil {
		b.cfg.OnPlan(plan)
	}
	b.cfg.OnProgress(Attesting, "attesting")
	t, key, err := b.attestOrUnseal(ctx, plan) // offline.go
	if err != nil {
		return &StageError{StageTicket, err}
	}
	if key != nil {
		if done, err := b.runOffline(ctx, plan, key); done {
			return err
		}
		if t, err = b.cfg.Tickets.Get(ctx, b.request(plan, false)); err != nil {
			return &StageError{StageTicket, err}
		}
	}
	var sealKey []byte // kept for a grant's seal, once the key opened the disk
	if b.off != nil && t.GetOfflineGrant() != nil {
		sealKey = bytes.Clone(t.DiskKey)
		defer clear(sealKey)
	}
	res, err := b.openDisk(ctx, plan, t)
	if err != nil {
		return &StageError{StageDisk, err}
	}
	b.off.afterTicket(ctx, b, t, sealKey)
	if _, ok := b.cfg.Disk.(disk.KeyedStage); ok { // the header is now on the ticket's generation
		plan.KeyGeneration = &res.KeyGeneration
		if b.cfg.OnPlan != nil {
			b.cfg.OnPlan(plan)
		}
	}
	b.cfg.OnProgress(DiskOpen, "state disk open")
	if err := b.join(ctx, plan, res, t); err != nil {
		return err
	}
	b.cfg.OnProgress(Done, "node ready")
	return nil
}

func (b *Boot) request(plan disk.Plan, wantToken bool) ticket.Request {
	return ticket.Request{NodeName: b.cfg.NodeName, DiskUUID: plan.UUID, Role: b.cfg.Role,
		Rejoin: plan.Rejoin, RequestToken: wantToken, DiskKeyGeneration: plan.KeyGeneration, Offline: b.OfflineHello()}
}

// openDisk hands the key to the disk stage and clears it afterwards; the
// rest of the ticket is what the join stage needs.
func (b *Boot) openDisk(ctx context.Context, plan disk.Plan, t *latchkeyv1.Ticket) (disk.Result, error) {
	b.cfg.OnProgress(OpeningDisk, "unlocking state disk")
	defer clear(t.DiskKey)
	res, err := openWithKeys(ctx, b.cfg.Disk, plan, t) // keys.go
	if err != nil {
		return res, err
	}
	b.cfg.Logger.Info("state disk open", logkey.DiskUUID, plan.UUID, logkey.Device, res.Device, logkey.KeyBytes, len(t.DiskKey),
		logkey.MountPoint, res.MountPoint, logkey.KubeletCredentials, res.HasKubeletCredentials)
	return res, nil
}

// join runs kubeadm join unless the node needs none: the disk holds
// kubelet credentials from an earlier join. A rejoin whose disk holds none
// (a crash between disk and join on an earlier boot) asks for a second
// ticket, this time with a token.
func (b *Boot) join(ctx context.Context, plan disk.Plan, res disk.Result, t *latchkeyv1.Ticket) error {
	switch {
	case b.cfg.Joiner == nil:
		b.cfg.Logger.Info("kubernetes join disabled; boot complete")
		return nil
	case res.HasKubeletCredentials:
		b.cfg.Logger.Info("node holds kubelet credentials; skipping kubeadm join")
		return nil
	}
	if t.GetToken() == "" {
		var err error
		if t, err = b.tokenTicket(ctx, plan); err != nil {
			return &StageError{StageTicket, err}
		}
	}
	b.cfg.OnProgress(Joining, "running kubeadm join")
	if err := b.joinAttempts(ctx, plan, t); err != nil {
		return &StageError{StageJoin, err}
	}
	return nil
}

// joinAttempts joins with first, and after a failed attempt waits and
// tries again with a fresh ticket, at most Config.JoinAttempts times.
func (b *Boot) joinAttempts(ctx context.Context, plan disk.Plan, first *latchkeyv1.Ticket) error {
	t, n := first, b.cfg.JoinAttempts
	var err error
	for attempt := 1; attempt <= n; attempt++ {
		if attempt > 1 {
			if werr := b.cfg.Sleep(ctx, b.cfg.JoinRetryDelay); werr != nil {
				return errors.Join(err, werr)
			}
			// The disk now carries this node's header: a fresh ticket is
			// a rejoin that asks for a token.
			if t, err = b.tokenTicket(ctx, disk.Plan{UUID: plan.UUID, Rejoin: true, KeyGeneration: plan.KeyGeneration}); err != nil {
				return fmt.Errorf("join: fetch ticket: %w", err)
			}
		}
		if err = b.cfg.Joiner.Join(ctx, t); err == nil {
			return nil
		}
		if n == 1 {
			return err
		}
		b.cfg.Logger.Warn("join attempt failed", logkey.Attempt, attempt, logkey.Attempts, n, logkey.Error, err)
	}
	return fmt.Errorf("join: giving up after %d attempts: %w", n, err)
}

func (b *Boot) tokenTicket(ctx context.Context, plan disk.Plan) (*latchkeyv1.Ticket, error) {
	if !plan.Rejoin {
		return nil, errors.New("the verifier issued no bootstrap token (is it in disk-only mode?)")
	}
	b.cfg.Logger.Info("rejoin found no kubelet credentials; asking for a bootstrap token")
	t, err := b.cfg.Tickets.Get(ctx, b.request(plan, true))
	if err != nil {
		return nil, err
	}
	clear(t.DiskKey)
	clear(t.PreviousDiskKey)
	if t.GetToken() == "" {
		return nil, fmt.Errorf("the verifier issued no bootstrap token for a rejoin that asked for one")
	}
	return t, nil
}
