package boot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// fakeSealer stands in for the TPM; its fields switch its behaviour.
type fakeSealer struct {
	key       []byte // what Unseal releases
	st        OfflineStatus
	unsealErr error
	renews    bool
	unseals   int
	sealed    [][]byte // the keys Seal was given (copies)
	withdrawn [][]byte // the sealed objects Withdraw was given
}

func (s *fakeSealer) Seal(key []byte, g *latchkeyv1.OfflineGrant) ([]byte, error) {
	s.sealed = append(s.sealed, bytes.Clone(key))
	return []byte(fmt.Sprintf("sealed-%d", len(s.sealed))), nil
}

func (s *fakeSealer) Unseal(sealed []byte, g *latchkeyv1.OfflineGrant) ([]byte, OfflineStatus, error) {
	s.unseals++
	if s.unsealErr != nil {
		return nil, OfflineStatus{}, s.unsealErr
	}
	return bytes.Clone(s.key), s.st, nil
}

func (s *fakeSealer) Withdraw(sealed []byte) error {
	s.withdrawn = append(s.withdrawn, sealed)
	return nil
}

func (s *fakeSealer) Renews(sealed []byte, g *latchkeyv1.OfflineGrant) bool { return s.renews }

type fakeStore struct {
	stored  []*disk.OfflineToken
	removed int
}

func (s *fakeStore) StoreOffline(_ context.Context, _ string, tok *disk.OfflineToken) error {
	s.stored = append(s.stored, tok)
	return nil
}

func (s *fakeStore) RemoveOffline(context.Context, string) error {
	s.removed++
	return nil
}

// windowTickets answers GetWithin with withinErr (or withinTicket) and
// Get with a ticket (key ticketKey, plus grant/withdraw) or getErr.
type windowTickets struct {
	withinErr    error
	withinTicket *latchkeyv1.Ticket
	getErr       error
	grant        *latchkeyv1.OfflineGrant
	withdraw     bool
	windows      []time.Duration
	reqs         []ticket.Request
}

var ticketKey = bytes.Repeat([]byte{0x42}, 32)

func (w *windowTickets) Get(_ context.Context, r ticket.Request) (*latchkeyv1.Ticket, error) {
	w.reqs = append(w.reqs, r)
	if w.getErr != nil {
		return nil, w.getErr
	}
	return &latchkeyv1.Ticket{DiskKey: bytes.Clone(ticketKey), OfflineGrant: w.grant, WithdrawOffline: w.withdraw}, nil
}

func (w *windowTickets) GetWithin(ctx context.Context, r ticket.Request, d time.Duration) (*latchkeyv1.Ticket, error) {
	w.windows = append(w.windows, d)
	w.reqs = append(w.reqs, r)
	if w.withinTicket != nil {
		return w.withinTicket, nil
	}
	return nil, w.withinErr
}

func grantOf(maxBoots uint32) *latchkeyv1.OfflineGrant {
	return &latchkeyv1.OfflineGrant{SignerPublic: []byte("signer"), PolicyRef: []byte("ref"), MaxBoots: maxBoots, MaxHours: 48,
		Pcrs: map[uint32][]byte{11: bytes.Repeat([]byte{1}, 32)}}
}

func tokenOf(t *testing.T, sealed string, g *latchkeyv1.OfflineGrant) *disk.OfflineToken {
	b, err := disk.EncodeGrant(g)
	if err != nil {
		t.Fatal(err)
	}
	return &disk.OfflineToken{Sealed: []byte(sealed), Grant: b}
}

type offlineRig struct {
	disk    *fakeDisk
	tickets *windowTickets
	sealer  *fakeSealer
	store   *fakeStore
	joiner  *fakeJoiner
	logs    *bytes.Buffer
	lines   []string
	boot    *Boot
}

const testAfter = 42 * time.Second

func newOfflineRig(t *testing.T, tok *disk.OfflineToken) *offlineRig {
	gen := uint32(3)
	r := &offlineRig{
		disk:    &fakeDisk{creds: true, plan: disk.Plan{UUID: "u-1", Rejoin: true, KeyGeneration: &gen, Offline: tok}},
		tickets: &windowTickets{}, sealer: &fakeSealer{key: bytes.Repeat([]byte{0x17}, 32)},
		store: &fakeStore{}, joiner: &fakeJoiner{}, logs: &bytes.Buffer{},
	}
	b, err := New(Config{NodeName: "n1", Disk: r.disk, Tickets: r.tickets, Joiner: r.joiner,
		Logger:     slog.New(slog.NewTextHandler(r.logs, nil)),
		OnProgress: func(_ Progress, line string) { r.lines = append(r.lines, line) },
		Offline:    &Offline{Sealer: r.sealer, Store: r.store, After: testAfter}})
	if err != nil {
		t.Fatal(err)
	}
	r.boot = b
	return r
}

var unreachable = fmt.Errorf("%w after 42s: %w", ticket.ErrUnreachable, errors.New("dial tcp: connection refused"))

// No verifier answered within offline.after: the TPM's key opens the
// disk, nothing else is asked of a verifier, no kubeadm join runs, and
// the status says how much of the grant is left.
func TestOfflineBootWhenNoVerifierAnswers(t *testing.T) {
	r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinErr = unreachable
	r.disk.creds = false // not joined yet: an offline boot cannot join
	r.sealer.st = OfflineStatus{Boot: 2, MaxBoots: 5, HoursLeft: 40.7}
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r.tickets.windows, []time.Duration{testAfter}) || len(r.tickets.reqs) != 1 {
		t.Fatalf("windows %v, requests %d: want one window of offline.after and no other request", r.tickets.windows, len(r.tickets.reqs))
	}
	if h := r.tickets.reqs[0].Offline; h == nil || !h.Held || h.BootedOffline {
		t.Fatalf("the boot's Hello.offline = %v, want held", h)
	}
	if !bytes.Equal(r.disk.keySeen, r.sealer.key) || !isZero(r.disk.keyPassed) {
		t.Fatal("the disk was not opened with the unsealed key, or the key was not cleared")
	}
	const line = "unlocked offline (boot 2 of 5, 40 hours left)"
	if last := r.lines[len(r.lines)-1]; last != line {
		t.Fatalf("status line %q, want %q", last, line)
	}
	if !strings.Contains(r.logs.String(), "state disk "+line) || !strings.Contains(r.logs.String(), "kubeadm join needs a verifier's token") {
		t.Fatalf("log:\n%s", r.logs)
	}
	if r.joiner.calls != 0 {
		t.Fatal("an offline boot ran kubeadm join")
	}
	want := &latchkeyv1.OfflineState{Held: true, BootedOffline: true, Boot: 2, MaxBoots: 5}
	if h := r.boot.OfflineHello(); !proto.Equal(h, want) || !r.boot.BootedOffline() {
		t.Fatalf("OfflineHello %v, want %v", h, want)
	}
}

func isZero(b []byte) bool { return len(b) > 0 && bytes.Count(b, []byte{0}) == len(b) }

// A verifier unavailable (a transient refusal) is no answer: it unlocks
// offline like an unreachable one.
func TestOfflineBootWhenVerifierUnavailable(t *testing.T) {
	r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinErr = fmt.Errorf("%w after 42s: %w", ticket.ErrUnreachable, &ticket.RefusedError{Reason: latchkeyv1.Reason_UNAVAILABLE})
	if err := r.boot.Run(context.Background()); err != nil || r.sealer.unseals != 1 {
		t.Fatalf("Run %v, unseals %d", err, r.sealer.unseals)
	}
}

// A refusal is an answer: never an offline unlock, whatever the window
// did; one that withdraws the grant erases it, and the next request says
// so.
func TestOfflineRefusalNeverUnseals(t *testing.T) {
	for _, withdraw := range []bool{false, true} {
		r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
		r.tickets.withinErr = &ticket.RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH, Detail: "pcr 11", WithdrawOffline: withdraw}
		r.tickets.getErr = errors.New("gave up after 10m: refused")
		err := r.boot.Run(context.Background())
		var se *StageError
		if !errors.As(err, &se) || se.Stage != StageTicket || r.sealer.unseals != 0 || r.disk.keySeen != nil {
			t.Fatalf("withdraw=%v: Run %v, unseals %d: want the ticket stage's failure and no unseal", withdraw, err, r.sealer.unseals)
		}
		if len(r.tickets.reqs) != 2 {
			t.Fatalf("requests %d: want the window then today's retries", len(r.tickets.reqs))
		}
		next := r.tickets.reqs[1].Offline
		if withdraw {
			if len(r.sealer.withdrawn) != 1 || string(r.sealer.withdrawn[0]) != "s0" || r.store.removed != 1 ||
				!proto.Equal(next, &latchkeyv1.OfflineState{Withdrawn: true}) {
				t.Fatalf("withdraw: TPM %q, removed %d, next Hello %v", r.sealer.withdrawn, r.store.removed, next)
			}
		} else if len(r.sealer.withdrawn) != 0 || r.store.removed != 0 || !proto.Equal(next, &latchkeyv1.OfflineState{Held: true}) {
			t.Fatalf("a refusal without withdraw erased the grant (next Hello %v)", next)
		}
	}
}

// A grant the TPM refuses (spent, expired) falls back to today's
// behaviour and says which bound was reached.
func TestOfflineSpentOrExpiredFallsBack(t *testing.T) {
	for _, bound := range []string{"offline grant spent: boot bound reached", "offline grant expired: time bound reached"} {
		r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
		r.tickets.withinErr = unreachable
		r.sealer.unsealErr = fmt.Errorf("unseal: %w", errors.New(bound))
		if err := r.boot.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(r.tickets.reqs) != 2 || !bytes.Equal(r.disk.keySeen, ticketKey) {
			t.Fatal("no fallback to the verifier's ticket")
		}
		if !strings.Contains(r.logs.String(), bound) || !strings.Contains(strings.Join(r.lines, "\n"), "offline unlock refused: unseal: "+bound) {
			t.Fatalf("the bound is not named: log\n%s\nlines %q", r.logs, r.lines)
		}
		if r.boot.BootedOffline() {
			t.Fatal("a fallback boot reports booted offline")
		}
	}
}

// The first ticket with a grant seals the key that opened the disk; a
// later one from the same signer only replaces the grant; one from
// another signer seals again; a ticket that withdraws erases it.
func TestOfflineGrantSealRenewWithdraw(t *testing.T) {
	r := newOfflineRig(t, nil)
	r.tickets.grant = grantOf(5)
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(r.sealer.sealed) != 1 || !bytes.Equal(r.sealer.sealed[0], ticketKey) || !isZero(r.disk.keyPassed) {
		t.Fatalf("sealed %x: want the ticket's key, once, and the ticket's key cleared", r.sealer.sealed)
	}
	if len(r.store.stored) != 1 || !reflect.DeepEqual(r.store.stored[0], tokenOf(t, "sealed-1", grantOf(5))) {
		t.Fatalf("stored %+v", r.store.stored)
	}
	if h := r.boot.OfflineHello(); !proto.Equal(h, &latchkeyv1.OfflineState{Held: true}) {
		t.Fatalf("OfflineHello %v", h)
	}

	// Renewal by the same signer: the grant replaced, no seal.
	r = newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.sealer.renews = true
	r.tickets.withinTicket = &latchkeyv1.Ticket{DiskKey: bytes.Clone(ticketKey), OfflineGrant: grantOf(6)}
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(r.sealer.sealed) != 0 || len(r.store.stored) != 1 || !reflect.DeepEqual(r.store.stored[0], tokenOf(t, "s0", grantOf(6))) {
		t.Fatalf("renewal: sealed %d, stored %+v", len(r.sealer.sealed), r.store.stored)
	}
	// The same grant again writes nothing.
	r.boot.OfflineTicket(context.Background(), &latchkeyv1.Ticket{OfflineGrant: grantOf(6)})
	if len(r.store.stored) != 1 {
		t.Fatal("an unchanged grant was written again")
	}

	// A re-attestation's renewal that only moves the time bound by less
	// than half the hours writes nothing; one half the hours later, or
	// one from a new boot, is written.
	at := func(clockMS uint64, reset uint32) *latchkeyv1.OfflineGrant {
		g := grantOf(6)
		g.ClockMs, g.ResetCount, g.Signature = clockMS, reset, []byte(fmt.Sprint("sig-", clockMS, reset))
		return g
	}
	r = newOfflineRig(t, tokenOf(t, "s0", at(1000, 7)))
	r.sealer.renews = true
	r.tickets.withinTicket = &latchkeyv1.Ticket{DiskKey: bytes.Clone(ticketKey), OfflineGrant: at(1000+600_000, 7)}
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(r.store.stored) != 0 {
		t.Fatalf("a renewal 10 minutes later was written: %+v", r.store.stored)
	}
	halfLater := at(1000+24*3600*1000, 7) // grantOf's 48 hours, halved
	r.boot.OfflineTicket(context.Background(), &latchkeyv1.Ticket{OfflineGrant: halfLater})
	if len(r.store.stored) != 1 || !reflect.DeepEqual(r.store.stored[0], tokenOf(t, "s0", halfLater)) {
		t.Fatalf("a renewal half the hours later: stored %+v", r.store.stored)
	}
	// Slip past: a new boot, a minute later, is written (the boot bound
	// counts from it); so is a clock that went back.
	newBoot := at(1000+24*3600*1000+60_000, 8)
	r.boot.OfflineTicket(context.Background(), &latchkeyv1.Ticket{OfflineGrant: newBoot})
	back := at(500, 8)
	r.boot.OfflineTicket(context.Background(), &latchkeyv1.Ticket{OfflineGrant: back})
	if len(r.store.stored) != 3 || !reflect.DeepEqual(r.store.stored[1], tokenOf(t, "s0", newBoot)) ||
		!reflect.DeepEqual(r.store.stored[2], tokenOf(t, "s0", back)) {
		t.Fatalf("a new boot and a clock gone back: stored %d", len(r.store.stored))
	}

	// Another signer (a rotated secret): sealed anew.
	r = newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinTicket = &latchkeyv1.Ticket{DiskKey: bytes.Clone(ticketKey), OfflineGrant: grantOf(6)}
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(r.sealer.sealed) != 1 || !reflect.DeepEqual(r.store.stored[0], tokenOf(t, "sealed-1", grantOf(6))) ||
		len(r.sealer.withdrawn) != 1 || string(r.sealer.withdrawn[0]) != "s0" {
		t.Fatalf("new signer: sealed %d, stored %+v, withdrawn %q: want the old object withdrawn, then a new seal", len(r.sealer.sealed), r.store.stored, r.sealer.withdrawn)
	}

	// Withdrawn by a ticket.
	r = newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinTicket = &latchkeyv1.Ticket{DiskKey: bytes.Clone(ticketKey), WithdrawOffline: true}
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(r.sealer.withdrawn) != 1 || r.store.removed != 1 || len(r.store.stored) != 0 ||
		!proto.Equal(r.boot.OfflineHello(), &latchkeyv1.OfflineState{Withdrawn: true}) {
		t.Fatalf("withdraw: TPM %d, removed %d, Hello %v", len(r.sealer.withdrawn), r.store.removed, r.boot.OfflineHello())
	}
}

// After an offline boot, the re-attestation's ticket ends the offline
// state and renews the grant without the key (same signer); a grant that
// needs a new seal waits for a boot with a key.
func TestOfflineReattestAfterOfflineBoot(t *testing.T) {
	r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinErr = unreachable
	r.sealer.st = OfflineStatus{Boot: 1, MaxBoots: 5, HoursLeft: 47}
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.boot.OfflineTicket(context.Background(), &latchkeyv1.Ticket{OfflineGrant: grantOf(7)})
	if len(r.store.stored) != 0 || !strings.Contains(r.logs.String(), "needs a new seal") {
		t.Fatalf("another signer's grant without a key: stored %d", len(r.store.stored))
	}
	r.sealer.renews = true
	r.boot.OfflineTicket(context.Background(), &latchkeyv1.Ticket{OfflineGrant: grantOf(8)})
	if r.boot.BootedOffline() || len(r.store.stored) != 1 || !reflect.DeepEqual(r.store.stored[0], tokenOf(t, "s0", grantOf(8))) {
		t.Fatalf("after re-attestation: booted offline %v, stored %+v", r.boot.BootedOffline(), r.store.stored)
	}
	// A refusal that withdraws, at a re-attestation, erases it.
	r.boot.OfflineRefused(context.Background(), fmt.Errorf("round: %w", &ticket.RefusedError{Reason: latchkeyv1.Reason_REVOKED, WithdrawOffline: true}))
	if len(r.sealer.withdrawn) != 1 || r.store.removed != 1 {
		t.Fatal("a withdrawing refusal at re-attestation did not erase the grant")
	}
}

// Offline unlock is off without a token: today's boot, no window.
func TestOfflineNoTokenIsTodaysBoot(t *testing.T) {
	r := newOfflineRig(t, nil)
	r.tickets.withinErr = unreachable
	if err := r.boot.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(r.tickets.windows) != 0 || r.sealer.unseals != 0 || r.tickets.reqs[0].Offline != nil {
		t.Fatalf("windows %v, unseals %d, Hello.offline %v", r.tickets.windows, r.sealer.unseals, r.tickets.reqs[0].Offline)
	}
}

// A window in which only a verifier that failed its pin answered is no
// answer (a host that can present a certificate could as well drop the
// packets); a failed evidence device is today's failure, no unseal.
func TestOfflinePinMismatchAndDeviceFailure(t *testing.T) {
	r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinErr = fmt.Errorf("gave up after 42s: %w", atls.ErrPinMismatch)
	if err := r.boot.Run(context.Background()); err != nil || r.sealer.unseals != 1 {
		t.Fatalf("pin mismatch: Run %v, unseals %d", err, r.sealer.unseals)
	}
	r = newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinErr = fmt.Errorf("evidence device failed: %w", attest.ErrDevice)
	if err := r.boot.Run(context.Background()); !errors.Is(err, attest.ErrDevice) || r.sealer.unseals != 0 || len(r.tickets.reqs) != 1 {
		t.Fatalf("device failure: Run %v, unseals %d, requests %d", err, r.sealer.unseals, len(r.tickets.reqs))
	}
}

// A refusal that withdraws, reached only in the fallback's retries, still
// erases the grant.
func TestOfflineWithdrawAfterFallback(t *testing.T) {
	r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	r.tickets.withinErr = unreachable
	r.sealer.unsealErr = errors.New("offline grant expired: time bound reached")
	r.tickets.getErr = fmt.Errorf("gave up after 10m: %w", &ticket.RefusedError{Reason: latchkeyv1.Reason_REVOKED, WithdrawOffline: true})
	if err := r.boot.Run(context.Background()); err == nil || len(r.sealer.withdrawn) != 1 || r.store.removed != 1 {
		t.Fatalf("Run %v, withdrawn %d, removed %d", err, len(r.sealer.withdrawn), r.store.removed)
	}
}

// keyDisk refuses one key, as a disk whose keyslot that key does not open.
type keyDisk struct {
	fakeDisk
	refuse []byte
}

func (d *keyDisk) Open(ctx context.Context, p disk.Plan, keys disk.Keys) (disk.Result, error) {
	if bytes.Equal(keys.Current, d.refuse) {
		return disk.Result{}, errors.New("unseal state disk: the ticket's key does not open it")
	}
	return d.fakeDisk.Open(ctx, p, keys)
}

// A released key that does not open the disk is no offline boot: the
// boot goes on with the verifiers.
func TestOfflineKeyThatDoesNotOpenFallsBack(t *testing.T) {
	r := newOfflineRig(t, tokenOf(t, "s0", grantOf(5)))
	d := &keyDisk{fakeDisk: *r.disk, refuse: r.sealer.key}
	b, err := New(Config{NodeName: "n1", Disk: d, Tickets: r.tickets, Logger: slog.New(slog.NewTextHandler(r.logs, nil)),
		Offline: &Offline{Sealer: r.sealer, Store: r.store, After: testAfter}})
	if err != nil {
		t.Fatal(err)
	}
	r.tickets.withinErr = unreachable
	if err := b.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.sealer.unseals != 1 || len(r.tickets.reqs) != 2 || !bytes.Equal(d.keySeen, ticketKey) || b.BootedOffline() ||
		!strings.Contains(r.logs.String(), "did not open the state disk; retrying the verifiers") {
		t.Fatalf("unseals %d, requests %d, booted offline %v\n%s", r.sealer.unseals, len(r.tickets.reqs), b.BootedOffline(), r.logs)
	}
}
