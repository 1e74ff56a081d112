package boot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"math"
	"sync"
	"time"

	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Offline unlock (docs/offline-unlock.md). A node whose verifier granted
// it offline unlock holds a TPM-sealed copy of its disk key and the grant
// in the state disk's latchkey-offline token. At boot, with a token held,
// the verifiers are tried first for Offline.After; only if none answered
// (unreachable, unavailable: never a refusal, which is an answer) is the
// key unsealed, and then only as far as the TPM allows (the grant's PCRs,
// boot and time bounds, the withdrawal counter). A grant that is spent
// or expired falls back to today's behaviour: keep trying the verifiers.
//
// Every successful ticket that carries a grant renews it: the first one
// (or the first after a signer change or a withdrawal) seals the key it
// opened the disk with; later ones only replace the stored grant. A
// ticket or refusal that withdraws the grant makes the TPM forget it
// (Sealer.Withdraw) and removes the token; the next contact reports it.

// OfflineStatus is where a grant stands for an offline boot.
type OfflineStatus struct {
	// Boot is this boot's number since the granting attestation (1 = the
	// first); MaxBoots the bound.
	Boot, MaxBoots uint32
	// HoursLeft of TPM time before the grant expires.
	HoursLeft float64
}

// Sealer is the TPM side of offline unlock (attest/tpm/offline, wired by
// agent/app). sealed is the offline.Sealed encoding.
type Sealer interface {
	// Seal seals key for grants like g.
	Seal(key []byte, g *latchkeyv1.OfflineGrant) (sealed []byte, err error)
	// Unseal releases the key if the TPM judges this boot within g; the
	// error names the bound that was reached.
	Unseal(sealed []byte, g *latchkeyv1.OfflineGrant) ([]byte, OfflineStatus, error)
	// Withdraw makes every copy of sealed useless.
	Withdraw(sealed []byte) error
	// Renews reports whether g opens sealed (the same signer and policy
	// ref): then g replaces the stored grant without a new seal.
	Renews(sealed []byte, g *latchkeyv1.OfflineGrant) bool
}

// TokenStore keeps the offline token in the state disk's header
// (disk.LUKS).
type TokenStore interface {
	StoreOffline(ctx context.Context, uuid string, tok *disk.OfflineToken) error
	RemoveOffline(ctx context.Context, uuid string) error
}

// WindowTickets tries the verifiers for a bounded time
// (ticket.Client.GetWithin).
type WindowTickets interface {
	GetWithin(ctx context.Context, req ticket.Request, window time.Duration) (*latchkeyv1.Ticket, error)
}

// Offline configures offline unlock; Config.Offline nil turns it off.
type Offline struct {
	Sealer Sealer
	Store  TokenStore
	// After is how long the boot tries the verifiers before it unlocks
	// offline (agent/config fills the default).
	After time.Duration
}

// offline is the boot's offline state, shared with the re-attestation
// that runs after the boot (OfflineHello, OfflineTicket, OfflineRefused).
type offline struct {
	cfg *Offline
	mu  sync.Mutex
	// uuid is the disk's; tok the stored token (nil: none).
	uuid string
	tok  *disk.OfflineToken
	// booted: this boot unlocked offline, and no verifier has attested
	// the node since; st its status.
	booted bool
	st     OfflineStatus
	// withdrawn: the grant was erased since the last contact reported it.
	withdrawn bool
}

// attestOrUnseal gets a ticket; with a token held, it tries the verifiers
// for Offline.After first and, if none answered, unseals the key. Exactly
// one of the ticket and the key is returned on success.
func (b *Boot) attestOrUnseal(ctx context.Context, plan disk.Plan) (*latchkeyv1.Ticket, []byte, error) {
	o := b.off
	if o != nil {
		o.uuid, o.tok = plan.UUID, plan.Offline
	}
	if o == nil || plan.Offline == nil {
		t, err := b.cfg.Tickets.Get(ctx, b.request(plan, false))
		return t, nil, err
	}
	w := b.cfg.Tickets.(WindowTickets) // New checked it
	t, err := w.GetWithin(ctx, b.request(plan, false), o.cfg.After)
	if err == nil {
		return t, nil, nil
	}
	var refused *ticket.RefusedError
	switch {
	case errors.As(err, &refused) && !refused.Transient():
		b.cfg.Logger.Warn("a verifier refused this node; no offline unlock, retrying the verifiers", logkey.Reason, refused.Reason.String())
		if refused.WithdrawOffline {
			o.withdraw(ctx, b)
		}
	case errors.Is(err, ticket.ErrStopped), ctx.Err() != nil:
		return nil, nil, err
	case errors.Is(err, ticket.ErrUnreachable), errors.Is(err, atls.ErrPinMismatch):
		// No verifier answered, or none that proved itself one: a host
		// that can present a wrong certificate could as well drop the
		// packets, and the TPM's bounds hold either way.
		key, err := b.unseal(plan)
		if err == nil {
			return nil, key, nil
		}
		b.cfg.Logger.Warn("offline unlock refused by the TPM; retrying the verifiers", logkey.Error, err.Error())
		b.cfg.OnProgress(Attesting, "attesting (offline unlock refused: "+err.Error()+")")
	default:
		// The evidence device failed: the same as without a token.
		return nil, nil, err
	}
	t, err = b.cfg.Tickets.Get(ctx, b.request(plan, false))
	if err != nil {
		b.OfflineRefused(ctx, err) // a refusal that withdraws, retried until the timeout
	}
	return t, nil, err
}

// unseal asks the TPM for the key.
func (b *Boot) unseal(plan disk.Plan) ([]byte, error) {
	o := b.off
	g, err := disk.DecodeGrant(plan.Offline.Grant)
	if err != nil {
		return nil, err
	}
	b.cfg.Logger.Info("no verifier answered; unlocking offline", logkey.OfflineAfter, o.cfg.After.String())
	key, st, err := o.cfg.Sealer.Unseal(plan.Offline.Sealed, g)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.booted, o.st = true, st
	o.mu.Unlock()
	return key, nil
}

// OfflineLine is the journal and status line of an offline boot.
func OfflineLine(st OfflineStatus) string {
	return fmt.Sprintf("unlocked offline (boot %d of %d, %d hours left)", st.Boot, st.MaxBoots, int(math.Floor(st.HoursLeft)))
}

// runOffline opens the disk with the unsealed key. It never runs kubeadm
// join: a bootstrap token comes only from a verifier. A node that holds
// kubelet credentials runs as after any reboot; one that does not stays
// unjoined until a boot that reaches a verifier.
//
// done is false when the released key did not open the disk and nothing
// was written: the boot then goes on as today, with the verifiers.
func (b *Boot) runOffline(ctx context.Context, plan disk.Plan, key []byte) (done bool, err error) {
	defer clear(key)
	b.cfg.OnProgress(OpeningDisk, "unlocking state disk offline")
	gen := uint32(0)
	if plan.KeyGeneration != nil {
		gen = *plan.KeyGeneration
	}
	res, err := openWithKeys(ctx, b.cfg.Disk, plan, &latchkeyv1.Ticket{DiskKey: key, KeyGeneration: gen})
	if errors.Is(err, disk.ErrHeaderWritten) {
		return true, &StageError{StageDisk, err}
	}
	if err != nil {
		b.off.mu.Lock()
		b.off.booted = false
		b.off.mu.Unlock()
		b.cfg.Logger.Warn("the key the TPM released did not open the state disk; retrying the verifiers", logkey.Error, err.Error())
		b.cfg.OnProgress(Attesting, "attesting (offline unlock failed: "+err.Error()+")")
		return false, nil
	}
	st := b.off.status()
	line := OfflineLine(st)
	b.cfg.Logger.Warn("state disk "+line, logkey.DiskUUID, plan.UUID, logkey.OfflineBoot, st.Boot, logkey.OfflineMaxBoots, st.MaxBoots,
		logkey.OfflineHoursLeft, st.HoursLeft, logkey.MountPoint, res.MountPoint, logkey.KubeletCredentials, res.HasKubeletCredentials)
	if b.cfg.OnPlan != nil {
		b.cfg.OnPlan(plan)
	}
	b.cfg.OnProgress(DiskOpen, line)
	if b.cfg.Joiner != nil && !res.HasKubeletCredentials {
		b.cfg.Logger.Warn("offline boot without kubelet credentials: kubeadm join needs a verifier's token; the node stays unjoined until a boot that reaches a verifier")
	}
	b.cfg.OnProgress(Done, line)
	return true, nil
}

// OfflineStatus is this boot's offline status; ok only while the node
// booted offline and no verifier has attested it since.
func (b *Boot) OfflineStatus() (st OfflineStatus, ok bool) {
	if !b.BootedOffline() {
		return OfflineStatus{}, false
	}
	return b.off.status(), true
}

// BootedOffline reports whether this boot unlocked offline and no
// verifier has attested the node since.
func (b *Boot) BootedOffline() bool {
	if b.off == nil {
		return false
	}
	b.off.mu.Lock()
	defer b.off.mu.Unlock()
	return b.off.booted
}

func (o *offline) status() OfflineStatus {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.st
}

// OfflineHello is what the next contact reports (Hello.offline); nil when
// the node never held a grant.
func (b *Boot) OfflineHello() *latchkeyv1.OfflineState {
	o := b.off
	if o == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.tok == nil && !o.withdrawn && !o.booted {
		return nil
	}
	s := &latchkeyv1.OfflineState{Held: o.tok != nil, BootedOffline: o.booted, Withdrawn: o.withdrawn}
	if o.booted {
		s.Boot, s.MaxBoots = o.st.Boot, o.st.MaxBoots
	}
	return s
}

// afterTicket acts on a ticket's offline fields once the disk opened with
// key (nil for a re-attestation, which carries no key): withdraw, seal
// and store, or replace the stored grant. Failures are logged: offline
// unlock is a fallback, never a reason to fail a boot.
func (o *offline) afterTicket(ctx context.Context, b *Boot, t *latchkeyv1.Ticket, key []byte) {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.booted, o.withdrawn = false, false // reported by the contact that brought t
	o.mu.Unlock()
	switch {
	case t.GetWithdrawOffline():
		o.withdraw(ctx, b)
	case t.GetOfflineGrant() != nil:
		if err := o.renew(ctx, b, t.GetOfflineGrant(), key); err != nil {
			b.cfg.Logger.Warn("offline grant not stored", logkey.Error, err.Error())
		}
	}
}

// renew stores g: with the sealed object already held when g opens it,
// else sealed anew under key (the old object withdrawn first).
func (o *offline) renew(ctx context.Context, b *Boot, g *latchkeyv1.OfflineGrant, key []byte) error {
	grant, err := disk.EncodeGrant(g)
	if err != nil {
		return err
	}
	o.mu.Lock()
	cur := o.tok
	o.mu.Unlock()
	var sealed []byte
	switch {
	case cur != nil && bytes.Equal(cur.Grant, grant):
		return nil
	case cur != nil && onlyRefreshesClock(cur.Grant, g):
		return nil
	case cur != nil && o.cfg.Sealer.Renews(cur.Sealed, g):
		sealed = cur.Sealed
	case len(key) == 0:
		return errors.New("the grant needs a new seal, which needs the disk key: at the next boot that reaches a verifier")
	default:
		// Another signer (a rotated secret): the old object is withdrawn
		// first, so no copy of the old token opens with the old grants.
		if cur != nil {
			if err := o.cfg.Sealer.Withdraw(cur.Sealed); err != nil {
				return fmt.Errorf("withdraw the grant of the previous signer: %w", err)
			}
		}
		if sealed, err = o.cfg.Sealer.Seal(key, g); err != nil {
			return fmt.Errorf("seal: %w", err)
		}
	}
	tok := &disk.OfflineToken{Sealed: sealed, Grant: grant}
	if err := o.cfg.Store.StoreOffline(ctx, o.uuid, tok); err != nil {
		return err
	}
	o.mu.Lock()
	o.tok = tok
	o.mu.Unlock()
	b.cfg.Logger.Info("offline grant stored", logkey.DiskUUID, o.uuid, logkey.OfflineMaxBoots, g.GetMaxBoots(), logkey.OfflineHeld, true)
	return nil
}

// onlyRefreshesClock reports whether g differs from the stored grant only
// by a time bound less than half its hours later: same signer, machine,
// PCRs, reset count and bounds. Such a renewal is not written: every
// re-attestation brings one, and writing each would rewrite the LUKS
// header every interval (144 times a day at the default 10 minutes) for
// nothing a boot needs; the stored grant keeps at least half its hours.
// A new boot (reset count), new PCRs (an upgrade), new bounds or a new
// signer is always written.
func onlyRefreshesClock(stored []byte, g *latchkeyv1.OfflineGrant) bool {
	cur, err := disk.DecodeGrant(stored)
	if err != nil || g.GetClockMs() < cur.GetClockMs() {
		return false
	}
	half := uint64(g.GetMaxHours()) * 3600 * 1000 / 2
	if g.GetClockMs()-cur.GetClockMs() >= half {
		return false
	}
	next := proto.Clone(g).(*latchkeyv1.OfflineGrant)
	next.ClockMs, next.Signature = cur.GetClockMs(), cur.GetSignature()
	return proto.Equal(next, cur)
}

// withdraw erases the grant: the TPM's counter first (every copy of the
// token dies), then the token. Withdrawn is reported only once both are
// done.
func (o *offline) withdraw(ctx context.Context, b *Boot) {
	o.mu.Lock()
	cur := o.tok
	o.mu.Unlock()
	if cur == nil {
		return
	}
	if err := o.cfg.Sealer.Withdraw(cur.Sealed); err != nil {
		b.cfg.Logger.Error("offline grant withdrawal failed in the TPM; the token is kept so a later contact retries", logkey.Error, err.Error())
		return
	}
	if err := o.cfg.Store.RemoveOffline(ctx, o.uuid); err != nil {
		b.cfg.Logger.Error("offline grant withdrawn in the TPM, token not removed (it no longer opens)", logkey.Error, err.Error())
	}
	o.mu.Lock()
	o.tok, o.withdrawn = nil, true
	o.mu.Unlock()
	b.cfg.Logger.Warn("offline grant withdrawn by the verifier and erased", logkey.DiskUUID, o.uuid)
}

// OfflineTicket acts on a re-attestation's ticket (renewal, withdrawal).
func (b *Boot) OfflineTicket(ctx context.Context, t *latchkeyv1.Ticket) {
	b.off.afterTicket(ctx, b, t, nil)
}

// OfflineRefused acts on a refusal at a re-attestation: one that
// withdraws the grant erases it.
func (b *Boot) OfflineRefused(ctx context.Context, err error) {
	var refused *ticket.RefusedError
	if b.off != nil && errors.As(err, &refused) && refused.WithdrawOffline {
		b.off.withdraw(ctx, b)
	}
}
