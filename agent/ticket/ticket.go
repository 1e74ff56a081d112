// Package ticket is the agent's ticket stage: it proves the machine to a
// verifier over attested TLS and returns the ticket.
//
// One attempt dials one verifier with TLS 1.3 (the verifier authenticated
// by SPKI pin before any evidence leaves the machine), binds fresh evidence
// to that session and the Hello fields, answers challenges, and
// acknowledges the ticket. Transient failures are retried with exponential
// backoff and full jitter across all endpoints, bounded by a total timeout;
// a policy refusal is reported with its reason and retried only slowly,
// since the same evidence will be refused again until the policy changes.
package ticket

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/clock"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Request is what the node asks for.
type Request struct {
	NodeName     string
	DiskUUID     string
	Role         latchkeyv1.Role
	Rejoin       bool
	RequestToken bool
	// Reattest asks for a re-attestation (PURPOSE_REATTEST): the verifier
	// records the decision and answers with an empty ticket, which is all
	// the client accepts for it.
	Reattest bool
	// DiskKeyGeneration is the master-secret generation the disk's
	// validated header names (nil on a first boot: no header yet).
	DiskKeyGeneration *uint32
	// Offline is what the node holds of an offline grant (Hello.offline);
	// nil when it never held one.
	Offline *latchkeyv1.OfflineState
}

// Config configures a Client. The zero value of every option is the
// secure one: without pins the client refuses to run unless
// InsecureSkipVerifierAuth is set.
type Config struct {
	// Endpoints are the verifiers' host:port, tried in turn.
	Endpoints []string
	Pins      []atls.Pin
	// InsecureSkipVerifierAuth accepts any verifier (lab use only).
	InsecureSkipVerifierAuth bool
	// ServerName is the name a verifier's certificate must be valid for
	// when it is accepted through a pinned CA (default: the host of the
	// endpoint being dialled). A pinned leaf needs no name.
	ServerName string
	Issuer     attest.Issuer
	// Timeout bounds all attempts together (DefaultTimeout when zero).
	Timeout time.Duration
	// AttemptTimeout bounds one attempt (default 30s).
	AttemptTimeout time.Duration
	// InitialBackoff and MaxBackoff shape retries after transient failures
	// (defaults 1s and 30s); RefusalBackoff is the wait after a policy
	// refusal (default 60s).
	InitialBackoff, MaxBackoff, RefusalBackoff time.Duration
	Logger                                     *slog.Logger
	// Sleep waits (injectable; default honours ctx).
	Sleep func(ctx context.Context, d time.Duration) error
	// OnAttempt is told of each attempt (for STATUS= lines); optional.
	OnAttempt func(endpoint string, attempt int)
	// OnAttemptFailed is told why an attempt failed; optional. A verifier
	// busy at its admission limit is not a failure: OnBusy is told instead.
	OnAttemptFailed func(err error)
	// OnTicket is told of each ticket received and acknowledged (what the
	// "ticket received" line logs); optional.
	OnTicket func(Received)
	// OnBusy is told of each retry-after hint honoured; optional.
	OnBusy func(retryAfter time.Duration)
	// Start picks the endpoint the first attempt goes to, from 0 to n-1
	// (default: at random, so a fleet spreads over the replicas instead of
	// all starting at the first one).
	Start func(n int) int
}

// Client fetches tickets.
type Client struct {
	cfg Config
	tls *tls.Config
}

// New checks cfg and fills defaults.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("ticket: no verifier endpoint configured")
	}
	if cfg.Issuer == nil {
		return nil, errors.New("ticket: no evidence issuer")
	}
	tlsCfg, err := atls.ClientConfig(cfg.Pins, cfg.InsecureSkipVerifierAuth)
	if err != nil {
		return nil, fmt.Errorf("ticket: %w", err)
	}
	fillDefaults(&cfg)
	return &Client{cfg: cfg, tls: tlsCfg}, nil
}

// DefaultTimeout bounds the whole ticket stage when the configuration
// names no timeout: long enough to ride out a control-plane restart, short
// enough that a node whose verifiers are all gone says so in the journal.
// agent/config fills the configuration's default from it, so the stage and
// the documented default (docs/configuration.md, `timeout`) are one value.
const DefaultTimeout = 10 * time.Minute

// DefaultAttemptTimeout bounds one attempt on one endpoint.
const DefaultAttemptTimeout = 30 * time.Second

// offlineGrace is what DefaultOfflineAfter adds to a full round: the
// backoff between the round's attempts.
const offlineGrace = 5 * time.Second

// DefaultOfflineAfter is how long a boot holding an offline grant tries n
// verifier endpoints before it unlocks offline (offline.after when
// unset): one full round, every endpoint given its whole attempt, plus a
// few seconds. agent/config fills the configuration's default from it.
func DefaultOfflineAfter(n int) time.Duration {
	return time.Duration(max(n, 1))*DefaultAttemptTimeout + offlineGrace
}

func fillDefaults(cfg *Config) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.Timeout, DefaultTimeout)
	def(&cfg.AttemptTimeout, DefaultAttemptTimeout)
	def(&cfg.InitialBackoff, time.Second)
	def(&cfg.MaxBackoff, 30*time.Second)
	def(&cfg.RefusalBackoff, 60*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sleep == nil {
		cfg.Sleep = clock.Sleep
	}
	if cfg.Start == nil {
		cfg.Start = rand.N[int]
	}
}

// Get returns a ticket, retrying until the total timeout. The error of a
// final failure wraps the last attempt's error: a *RefusedError when the
// verifier refused, ErrUnreachable otherwise.
func (c *Client) Get(parent context.Context, req Request) (*latchkeyv1.Ticket, error) {
	return c.get(parent, req, c.cfg.Timeout, false)
}

// GetWithin is Get bounded by window instead of the total timeout, and
// ended by the first refusal a verifier decided (a *RefusedError, not
// transient): the boot's question before it unlocks offline is "did any
// verifier answer?", and a refusal is an answer that must never fall
// back to offline unlock. ErrUnreachable when none answered in time.
func (c *Client) GetWithin(parent context.Context, req Request, window time.Duration) (*latchkeyv1.Ticket, error) {
	return c.get(parent, req, window, true)
}

func (c *Client) get(parent context.Context, req Request, timeout time.Duration, endOnRefusal bool) (*latchkeyv1.Ticket, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	var last error
	start := c.cfg.Start(len(c.cfg.Endpoints))
	fails := 0 // failed attempts, the exponent of the backoff
	wrongPin := map[string]bool{}
	for n := 0; ; n++ {
		ep := c.cfg.Endpoints[(start+n)%len(c.cfg.Endpoints)]
		if c.cfg.OnAttempt != nil {
			c.cfg.OnAttempt(ep, n+1)
		}
		t, err := c.attempt(ctx, ep, req)
		if err == nil {
			return t, nil
		}
		if wait, ok := busy(err); ok {
			// Honour the verifier's hint (with jitter); it is not a
			// failure, only time spent.
			if last == nil || ctx.Err() == nil {
				last = err
			}
			if !c.honourBusy(ctx, ep, n+1, wait) {
				return nil, c.stopped(parent, last, timeout)
			}
			continue
		}
		if last == nil || ctx.Err() == nil {
			// An attempt cut short by the total deadline says less than the
			// one before it.
			last = err
		}
		if c.cfg.OnAttemptFailed != nil {
			c.cfg.OnAttemptFailed(err)
		}
		if stop := c.finalError(err, ep, endOnRefusal, wrongPin); stop != nil {
			return nil, stop
		}
		wait := c.backoff(fails, err)
		fails++
		c.cfg.Logger.Warn("join attempt failed", logkey.Endpoint, ep, logkey.Attempt, n+1,
			logkey.Reason, reasonString(err), logkey.Error, err.Error(), logkey.RetryIn, wait.Round(time.Millisecond).String())
		if ctx.Err() != nil || c.cfg.Sleep(ctx, wait) != nil {
			return nil, c.stopped(parent, last, timeout)
		}
	}
}

// honourBusy waits out a busy verifier's retry hint (with jitter): a busy
// answer is not a failed attempt, so it neither counts towards the backoff
// nor ends the retries, it only spends time. It is false when the wait was
// cut short (deadline or stop).
func (c *Client) honourBusy(ctx context.Context, ep string, attempt int, wait time.Duration) bool {
	if c.cfg.OnBusy != nil {
		c.cfg.OnBusy(wait)
	}
	wait = jitterHint(wait)
	c.cfg.Logger.Info("verifier asked to retry later, retrying after its hint", logkey.Endpoint, ep, logkey.Attempt, attempt,
		logkey.RetryIn, wait.Round(time.Millisecond).String())
	return ctx.Err() == nil && c.cfg.Sleep(ctx, wait) == nil
}

// finalError is the error that ends the retries after the failed attempt
// at ep, nil to keep retrying: waiting cannot change a verifier's decision
// (when endOnRefusal), a failed evidence device, or pins that every
// configured verifier contradicts. wrongPin records the endpoints that
// answered with a certificate the pins do not match.
func (c *Client) finalError(err error, ep string, endOnRefusal bool, wrongPin map[string]bool) error {
	if endOnRefusal && decided(err) {
		return err
	}
	if errors.Is(err, attest.ErrDevice) {
		// The TPM (or SNP device) failed: no verifier can fix that,
		// so stop instead of retrying for the whole timeout.
		return fmt.Errorf("evidence device failed: %w", err)
	}
	if errors.Is(err, atls.ErrPinMismatch) {
		// Every configured verifier answered with a certificate the
		// pins do not match: the pin (or the verifiers' certificate)
		// is wrong, and waiting cannot fix it. One that has not yet
		// answered so keeps the retries going (a relay may sit in
		// front of one replica only).
		if wrongPin[ep] = true; len(wrongPin) == len(c.cfg.Endpoints) {
			return fmt.Errorf("no configured verifier matches the pins: %w", err)
		}
	}
	return nil
}

// stopped is the error of a Get whose wait was cut short.
func (c *Client) stopped(parent context.Context, last error, timeout time.Duration) error {
	if parent.Err() != nil {
		// Stopped (SIGTERM), not timed out: say so.
		return fmt.Errorf("%w before a ticket arrived (last attempt: %v)", ErrStopped, last)
	}
	return giveUp(last, timeout)
}

// decided reports whether err is a refusal a verifier decided.
func decided(err error) bool {
	var r *RefusedError
	return errors.As(err, &r) && !r.Transient()
}

// backoff is full jitter over an exponential ceiling for transient
// failures, and the slow refusal wait (with a little jitter) otherwise.
func (c *Client) backoff(n int, err error) time.Duration {
	var r *RefusedError
	if (errors.As(err, &r) && !r.Transient()) || errors.Is(err, atls.ErrPinMismatch) {
		// The same evidence (or the same wrong pin) fails again until an
		// operator changes something: retry slowly.
		return c.cfg.RefusalBackoff/2 + rand.N(c.cfg.RefusalBackoff/2+1)
	}
	ceil := c.cfg.InitialBackoff << min(n, 16)
	if ceil > c.cfg.MaxBackoff || ceil <= 0 {
		ceil = c.cfg.MaxBackoff
	}
	return rand.N(ceil + 1)
}

func giveUp(last error, timeout time.Duration) error {
	var r *RefusedError
	if (errors.As(last, &r) && !r.Transient()) || errors.Is(last, atls.ErrPinMismatch) {
		return fmt.Errorf("gave up after %s: %w", timeout, last)
	}
	return fmt.Errorf("%w after %s: %w", ErrUnreachable, timeout, last)
}
