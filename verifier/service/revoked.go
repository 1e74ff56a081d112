package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/token"
)

// checkRevoked refuses, as REVOKED, a verified join or re-attestation
// that matches the policy's deny list (node name, disk UUID, machine
// identity, EK or AK hash, SNP chip ID), or whose machine is the one a
// denied node name or disk UUID is bound to (DeniedByBinding). It runs
// right after verification, so the audit line carries the attested
// identity, and before the role check, any binding claim, key derivation
// or mint. The matching entry goes to the audit line. A token recorded on
// the node's binding for this machine is deleted too: a machine revoked
// while it held an unused bootstrap token must not keep it (the Revoker
// sweeps the rest).
func (s *Service) checkRevoked(ctx context.Context, snap *policy.Snapshot, hello *latchkeyv1.Hello, v *attest.Verified, out *outcome) error {
	entry := snap.Deny.Match(hello.GetNodeName(), hello.GetDiskUuid(), v)
	if entry == "" && v != nil {
		var err error
		if entry, err = DeniedByBinding(ctx, s.cfg.Bindings, snap.Deny, v.MachineID); err != nil {
			return attest.Refuse(latchkeyv1.Reason_UNAVAILABLE, "deny list: %w", err)
		}
	}
	if entry == "" {
		return nil
	}
	out.revoked = entry
	if s.cfg.Minter != nil && v.MachineID != "" {
		if r, err := s.cfg.Bindings.Get(ctx, binding.Node, hello.GetNodeName()); err == nil && r.Identity == v.MachineID && r.TokenID != "" {
			if s.cfg.Revoker != nil {
				s.cfg.Revoker.revoke(ctx, r, entry)
			} else {
				revokeDenied(ctx, s.cfg.Minter, s.cfg.Metrics, s.log, r, entry, s.cfg.RevokeTimeout)
			}
		}
	}
	return attest.Refuse(latchkeyv1.Reason_REVOKED,
		"revoked by the policy's deny list (%s); an operator readmits the machine by removing the entry", entry)
}

// DeniedByBinding returns the entry that denies machine id because a
// denied node name or disk UUID is bound to it ("deny.nodeNames:
// worker-7, the machine bound to it"), or "". It reads one record per
// such entry (deny lists are short), so a denied machine is refused under
// a fresh name or disk as well. A name never bound (every node name in
// disk-only mode) denies no machine. A record that cannot be read is an
// error: the caller cannot show it is not the denied machine. The join,
// the re-attestation and the CSR approver (verifier/app NodeTokens) all
// ask it.
func DeniedByBinding(ctx context.Context, store binding.Store, deny *policy.DenyList, id string) (string, error) {
	if id == "" {
		return "", nil
	}
	for _, e := range []struct {
		kind  binding.Kind
		key   string
		names []string
	}{{binding.Node, policy.DenyNodeNames, deny.NodeNames()}, {binding.Disk, policy.DenyDiskUUIDs, deny.DiskUUIDs()}} {
		for _, name := range e.names {
			r, err := store.Get(ctx, e.kind, name)
			switch {
			case errors.Is(err, binding.ErrNotFound):
				continue
			case err != nil:
				return "", fmt.Errorf("read the binding of denied %s %s: %w", e.kind, name, err)
			case r.Bound() && r.Identity == id:
				return policy.BoundMachineEntry(e.key + ": " + name), nil
			}
		}
	}
	return "", nil
}

// revokeDenied deletes the token on a denied node's record, on a fresh
// context (the join's may be ending). It reports whether the token is
// gone.
func revokeDenied(ctx context.Context, m token.Minter, mt *metrics.Metrics, log *slog.Logger, r binding.Record, entry string, timeout time.Duration) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := m.Revoke(rctx, r.TokenID); err != nil {
		log.Error("revoke bootstrap token of a denied node failed; retried at the next sweep",
			logkey.Node, r.Name, logkey.Identity, r.Identity, logkey.TokenID, r.TokenID, logkey.Deny, entry, logkey.Error, err.Error())
		return false
	}
	mt.TokenRevoked(metrics.RevokeDenied)
	log.Warn("revoked bootstrap token of a denied node",
		logkey.Node, r.Name, logkey.Identity, r.Identity, logkey.TokenID, r.TokenID, logkey.Deny, entry)
	return true
}

// RevokerConfig configures a Revoker.
type RevokerConfig struct {
	Policy   policy.Source
	Bindings binding.Store
	Minter   token.Minter
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
	// Interval between sweeps (default 30s). Besides these, Kick asks for
	// one at once (the policy reload hook does).
	Interval time.Duration
	// RevokeTimeout bounds one Revoke call (default 10s).
	RevokeTimeout time.Duration
}

// Revoker deletes the bootstrap tokens recorded for denied nodes: for
// every node binding with a token whose node name or identity the deny
// list in force names, or whose identity holds a denied disk UUID or node
// name (the machine bound to it, under any of its names), it
// calls the minter's Revoke. It sweeps at start, whenever it is kicked
// (after a policy reload) and every Interval. The periodic sweep matters:
// a join keeps the policy snapshot it started with, so one that was in
// flight when the deny entry arrived can still record a token after the
// reload's sweep; the next sweep takes it back. Every replica runs one;
// Revoke of a deleted token is a no-op.
type Revoker struct {
	cfg  RevokerConfig
	kick chan struct{}
	mu   sync.Mutex // guards done; a join's refusal and a sweep may race
	// done holds the token IDs already revoked, so a sweep does not call
	// the API server again for them (pruned to the IDs still on record).
	done map[string]bool
	// skipLogged holds the keys of unreadable records already logged, so
	// a record that stays bad is logged once, not at every sweep (pruned
	// to the records still skipped).
	skipLogged map[string]bool
}

// NewRevoker checks cfg and fills defaults.
func NewRevoker(cfg RevokerConfig) (*Revoker, error) {
	if cfg.Policy == nil || cfg.Bindings == nil || cfg.Minter == nil {
		return nil, errors.New("revoker: needs a policy source, a binding store and a minter")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Interval = orDefault(cfg.Interval, 30*time.Second)
	cfg.RevokeTimeout = orDefault(cfg.RevokeTimeout, 10*time.Second)
	return &Revoker{cfg: cfg, kick: make(chan struct{}, 1), done: map[string]bool{}, skipLogged: map[string]bool{}}, nil
}

// Kick asks for a sweep now; it never blocks.
func (r *Revoker) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run sweeps until ctx ends.
func (r *Revoker) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.Sweep(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("revocation sweep failed; retried at the next one", logkey.Error, err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
	}
}

// revoke deletes rec's token unless this Revoker already did, so the
// metric counts each token once.
func (r *Revoker) revoke(ctx context.Context, rec binding.Record, entry string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done[rec.TokenID] {
		return false
	}
	if !revokeDenied(ctx, r.cfg.Minter, r.cfg.Metrics, r.cfg.Logger, rec, entry, r.cfg.RevokeTimeout) {
		return false
	}
	r.done[rec.TokenID] = true
	return true
}

// logSkipped logs each unreadable record once while it stays unreadable.
func (r *Revoker) logSkipped(skipped []binding.SkippedRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := map[string]bool{}
	for _, sk := range skipped {
		now[sk.Key] = true
		if !r.skipLogged[sk.Key] {
			r.cfg.Logger.Warn("revocation sweep: binding record unreadable, skipped", logkey.Record, sk.Key, logkey.Error, sk.Reason)
		}
	}
	r.skipLogged = now
}

// Sweep revokes, once, the token of every node binding the deny list in
// force names, and returns how many it revoked.
func (r *Revoker) Sweep(ctx context.Context) (int, error) {
	deny := r.cfg.Policy.Current().Deny
	if deny.Empty() {
		return 0, nil
	}
	recs, err := r.cfg.Bindings.List(ctx)
	skipped, err := binding.Skipped(err)
	if err != nil {
		return 0, err
	}
	// One unreadable record must not stop the sweep for every other.
	r.logSkipped(skipped)
	// A denied disk or node name revokes the machine bound to it, under
	// any of its names.
	owner := map[string]string{}
	for _, rec := range recs {
		switch {
		case !rec.Bound():
		case rec.Kind == binding.Disk && deny.DeniesDisk(rec.Name):
			owner[rec.Identity] = policy.BoundMachineEntry(policy.DenyDiskUUIDs + ": " + rec.Name)
		case rec.Kind == binding.Node && deny.DeniesNode(rec.Name):
			owner[rec.Identity] = policy.BoundMachineEntry(policy.DenyNodeNames + ": " + rec.Name)
		}
	}
	n := 0
	seen := map[string]bool{}
	for _, rec := range recs {
		if rec.Kind != binding.Node || !rec.Bound() || rec.TokenID == "" {
			continue
		}
		seen[rec.TokenID] = true
		entry := deny.MatchIdentity(rec.Identity)
		switch {
		case deny.DeniesNode(rec.Name):
			entry = policy.DenyNodeNames + ": " + rec.Name
		case entry == "":
			entry = owner[rec.Identity]
		}
		if entry != "" && r.revoke(ctx, rec, entry) {
			n++
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.done {
		if !seen[id] {
			delete(r.done, id)
		}
	}
	return n, nil
}
