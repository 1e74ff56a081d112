// Package reattest is the agent's stage after the boot: it keeps the node
// attesting. Every interval (jittered by ±10%, so a fleet booted together
// spreads out) it asks the verifier for a re-attestation: the same Join
// protocol with fresh evidence and a Hello whose purpose is
// PURPOSE_REATTEST, which asks for no key and no token. The verifier
// records the decision on the node's Lease; its taint controller acts on
// it.
//
// Failure modes are bounded and never end the agent: a refusal is logged
// (the verifier has recorded it; the taint follows from there), and a
// verifier that cannot be reached is logged and tried again at the next
// interval. Each round is bounded by its own timeout, so one round never
// overlaps the next.
package reattest

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/internal/clock"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// DefaultInterval is reattest.interval when unset.
const DefaultInterval = 10 * time.Minute

// MaxRoundTimeout bounds the default round timeout.
const MaxRoundTimeout = 5 * time.Minute

// OfflineRetry bounds the wait between rounds while the node has booted
// offline and no verifier has attested it since.
const OfflineRetry = 5 * time.Second

// Jitter is the fraction of the interval each wait varies by.
const Jitter = 0.10

// Tickets runs one re-attestation (ticket.Client).
type Tickets interface {
	Get(ctx context.Context, req ticket.Request) (*latchkeyv1.Ticket, error)
}

// Result of one round, as the log and OnRound report it.
type Result string

// Results.
const (
	Attested    Result = "attested"
	Refused     Result = "refused"
	Unreachable Result = "unreachable"
)

// Config configures a Loop.
type Config struct {
	NodeName string
	DiskUUID string
	// DiskKeyGeneration is the master-secret generation the open disk is
	// keyed under (nil: unknown), reported so the verifier's disk record
	// shows it without waiting for the next boot.
	DiskKeyGeneration *uint32
	Role              latchkeyv1.Role
	Tickets           Tickets
	// Interval between rounds (DefaultInterval when zero).
	Interval time.Duration
	// RoundTimeout bounds one round, retries included (default: half the
	// interval, at most 5 minutes).
	RoundTimeout time.Duration
	Logger       *slog.Logger
	// Sleep waits (clock.Sleep when nil); Rand returns [0,1) (math/rand
	// when nil). Both are for tests.
	Sleep func(ctx context.Context, d time.Duration) error
	Rand  func() float64
	// OnRound is told each round's result; optional.
	OnRound func(round int, r Result, err error)
	// Offline is the boot's offline-unlock state (boot.Boot); optional.
	Offline Offline
	// StopWhenAttested ends Run after the first round that attests (the
	// re-attestation an offline boot owes with re-attestation off).
	StopWhenAttested bool
	// Cordon marks the Node unschedulable after an offline boot
	// (agent/cordon); optional.
	Cordon Cordoner
}

// Cordoner cordons the node after an offline boot. Run calls it before
// each round while the node booted offline and has not been attested
// since, until it reports done: the attempt always completes before the
// round's re-attestation is sent, so the verifier's uncordon, which
// follows that re-attestation, is never overtaken by a late cordon. A
// round that attests ends the attempts, whether or not one succeeded.
type Cordoner interface {
	// Cordon makes one bounded attempt; done when nothing is left to do.
	Cordon(ctx context.Context) (done bool)
}

// Offline is what a round reports of the node's offline grant and how it
// hands back what the verifier said of it (boot.Boot implements it).
type Offline interface {
	// BootedOffline: the boot unlocked offline and no verifier has
	// attested the node since; rounds then run back to back until one
	// attests (each round's ticket client retries with backoff).
	BootedOffline() bool
	OfflineHello() *latchkeyv1.OfflineState
	// OfflineTicket renews or withdraws the grant from a ticket;
	// OfflineRefused withdraws it on a refusal that says so.
	OfflineTicket(ctx context.Context, t *latchkeyv1.Ticket)
	OfflineRefused(ctx context.Context, err error)
}

// Loop re-attests until its context ends.
type Loop struct{ cfg Config }

// New checks cfg.
func New(cfg Config) (*Loop, error) {
	if cfg.Tickets == nil || cfg.NodeName == "" || cfg.DiskUUID == "" {
		return nil, errors.New("reattest: node name, disk uuid and ticket client are required")
	}
	if cfg.Interval < 0 || cfg.RoundTimeout < 0 {
		return nil, errors.New("reattest: negative interval or round timeout")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.RoundTimeout == 0 {
		cfg.RoundTimeout = min(cfg.Interval/2, MaxRoundTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sleep == nil {
		cfg.Sleep = clock.Sleep
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	return &Loop{cfg: cfg}, nil
}

// Next is the wait before the next round: Interval ±10%.
func (l *Loop) Next() time.Duration {
	f := 1 - Jitter + 2*Jitter*l.cfg.Rand()
	return time.Duration(float64(l.cfg.Interval) * f)
}

// Run waits an interval, re-attests, and repeats until ctx ends; it
// returns nil then. No round's failure ends it.
func (l *Loop) Run(ctx context.Context) error {
	cordoned := false
	for round := 1; ; round++ {
		wait := l.Next()
		if l.cfg.Offline != nil && l.cfg.Offline.BootedOffline() {
			// Re-attest the moment a verifier answers: the first round at
			// once, later ones after a short pause (a round that ends at
			// once, a failed TPM, must not spin).
			wait = min(wait, OfflineRetry)
			if round == 1 {
				wait = 0
			}
		}
		if err := l.cfg.Sleep(ctx, wait); err != nil {
			return nil
		}
		if !cordoned && l.cfg.Cordon != nil && l.cfg.Offline != nil && l.cfg.Offline.BootedOffline() {
			cordoned = l.cfg.Cordon.Cordon(ctx)
		}
		r, err := l.Round(ctx)
		if ctx.Err() != nil {
			return nil
		}
		l.log(round, r, err)
		if l.cfg.OnRound != nil {
			l.cfg.OnRound(round, r, err)
		}
		if r == Attested && l.cfg.StopWhenAttested {
			return nil
		}
	}
}

// Round runs one re-attestation, bounded by RoundTimeout.
func (l *Loop) Round(ctx context.Context) (Result, error) {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.RoundTimeout)
	defer cancel()
	req := ticket.Request{NodeName: l.cfg.NodeName, DiskUUID: l.cfg.DiskUUID,
		Role: l.cfg.Role, Rejoin: true, Reattest: true, DiskKeyGeneration: l.cfg.DiskKeyGeneration}
	if l.cfg.Offline != nil {
		req.Offline = l.cfg.Offline.OfflineHello()
	}
	t, err := l.cfg.Tickets.Get(rctx, req)
	if l.cfg.Offline != nil {
		if err == nil {
			l.cfg.Offline.OfflineTicket(ctx, t)
		} else {
			l.cfg.Offline.OfflineRefused(ctx, err)
		}
	}
	return classify(err), err
}

// classify: a refusal the verifier decided is Refused; everything else
// (no verifier, a timeout, a transient refusal) is Unreachable, which is
// not a failed attestation.
func classify(err error) Result {
	var r *ticket.RefusedError
	switch {
	case err == nil:
		return Attested
	case errors.As(err, &r) && !r.Transient():
		return Refused
	}
	return Unreachable
}

func (l *Loop) log(round int, r Result, err error) {
	next := l.cfg.Interval.String()
	switch r {
	case Attested:
		l.cfg.Logger.Info("re-attested", logkey.Round, round, logkey.Result, string(r), logkey.NextIn, next)
	case Refused:
		var re *ticket.RefusedError
		errors.As(err, &re)
		l.cfg.Logger.Error("re-attestation refused; the verifier marks this node unattested",
			logkey.Round, round, logkey.Result, string(r), logkey.Reason, re.Reason.String(), logkey.Error, err.Error(), logkey.NextIn, next)
	default:
		l.cfg.Logger.Warn("re-attestation did not reach a verifier; trying again next interval",
			logkey.Round, round, logkey.Result, string(r), logkey.Error, err.Error(), logkey.NextIn, next)
	}
}
