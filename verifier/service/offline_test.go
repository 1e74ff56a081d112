package service_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/keys"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
)

const offlineMachine = "tpm-ek:sha256:0a0a"

var (
	pcr7, pcr11Quoted, pcr11Join = bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{0x11}, 32), bytes.Repeat([]byte{0x1f}, 32)
	bounds                       = &policy.OfflineUnlock{MaxBoots: 3, MaxHours: 72}
)

// sealingValidator is the fake validator whose states can seal
// (attest.Sealer), as a TPM's do: the quoted PCRs and clock, and PCR 11's
// join-point value (pcr11Join) when the quote was not made at the join.
type sealingValidator struct {
	*attesttest.Validator
	// noJoinPoint: a re-attestation's PCR 11 join point is not derivable.
	noJoinPoint bool
}

type sealingState struct {
	*attesttest.State
	v *sealingValidator
}

func (s *sealingState) SealFacts(quotedAtJoin bool) (attest.SealFacts, error) {
	f := attest.SealFacts{PCRs: map[uint32][]byte{7: pcr7, 11: pcr11Quoted}, ResetCount: 17, ClockMS: 987654321}
	if !quotedAtJoin {
		if s.v.noJoinPoint {
			return attest.SealFacts{}, errors.New("pcr 11 join point unknown")
		}
		f.PCRs[11] = pcr11Join
	}
	return f, nil
}

func (v *sealingValidator) Verify(ctx context.Context, ev, b []byte, rt attest.RoundTrip) (*attest.Verified, error) {
	ver, err := v.Validator.Verify(ctx, ev, b, rt)
	if err != nil {
		return nil, err
	}
	ver.State = &sealingState{State: ver.State.(*attesttest.State), v: v}
	return ver, nil
}

func (v *sealingValidator) CheckPolicy(st attest.State) error {
	if s, ok := st.(*sealingState); ok {
		return v.Validator.CheckPolicy(s.State)
	}
	return v.Validator.CheckPolicy(st)
}

func newSealing(id string) *sealingValidator {
	return &sealingValidator{Validator: &attesttest.Validator{MachineID: id}}
}

// fakeSigner records the requests and "signs" them.
type fakeSigner struct {
	mu   sync.Mutex
	reqs []offline.GrantRequest
}

func (f *fakeSigner) Grant(r offline.GrantRequest) (*latchkeyv1.OfflineGrant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, r)
	return &latchkeyv1.OfflineGrant{PolicyRef: r.PolicyRef, Pcrs: r.PCRs, ResetCount: r.ResetCount, ClockMs: r.ClockMS,
		MaxBoots: r.MaxBoots, MaxHours: r.MaxHours, Signature: []byte("signed")}, nil
}

// offlineStore adds binding.OfflineRecorder to the recording store.
type offlineStore struct {
	*recordingStore
	boots []string
}

func (o *offlineStore) RecordOfflineBoot(ctx context.Context, node, identity string, at time.Time) error {
	rec, err := o.Get(ctx, binding.Node, node)
	if err != nil {
		return err
	}
	if err := binding.Check(rec, identity); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.boots = append(o.boots, node)
	return nil
}

func (o *offlineStore) bootsRecorded() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.boots)
}

// round runs one join or re-attestation of h on a raw stream (the
// Hello's offline field is what an offline-capable agent sends): the
// ticket, acknowledged, or the refusal.
func round(t *testing.T, e *env, h *latchkeyv1.Hello) (*latchkeyv1.Ticket, *latchkeyv1.Refusal) {
	t.Helper()
	s := rawStream(t, e)
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	if err := s.Send(helloMsg(h)); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		return nil, refusalDetail(t, err)
	}
	tk := m.GetTicket()
	if tk == nil {
		t.Fatalf("got %T, want a ticket", m.GetMsg())
	}
	if err := s.Send(&latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_TicketAck{TicketAck: &latchkeyv1.TicketAck{}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the ack: %v, want the stream's end", err)
	}
	return tk, nil
}

func refusalDetail(t *testing.T, err error) *latchkeyv1.Refusal {
	t.Helper()
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if r, ok := d.(*latchkeyv1.Refusal); ok {
			return r
		}
	}
	t.Fatalf("status %v carries no Refusal", err)
	return nil
}

func joinHello() *latchkeyv1.Hello {
	h := baseHello()
	h.Purpose = latchkeyv1.Purpose_PURPOSE_JOIN
	return h
}

func rejoinHello() *latchkeyv1.Hello {
	h := joinHello()
	h.Rejoin = true
	return h
}

func reattestHello() *latchkeyv1.Hello {
	h := rejoinHello()
	h.Purpose = latchkeyv1.Purpose_PURPOSE_REATTEST
	return h
}

func mustTicket(t *testing.T, e *env, h *latchkeyv1.Hello) *latchkeyv1.Ticket {
	t.Helper()
	tk, r := round(t, e, h)
	if r != nil {
		t.Fatalf("refused: %v %s", r.GetReason(), r.GetDetail())
	}
	return tk
}

// Every successful ticket (join, rejoin, re-attestation) carries a grant
// built from the verified facts: the quote's clock and PCRs, PCR 11 at
// the join point for the re-attestation, the policy's bounds, and the
// policy ref of the attested machine and the disk.
func TestOfflineGrantInEveryTicket(t *testing.T) {
	sg, m := &fakeSigner{}, metrics.New()
	e := startVerifier(t, envOpt{val: newSealing(offlineMachine), grants: sg, offline: bounds, metrics: m})
	ref := offline.PolicyRef([]byte(offlineMachine), diskA)
	for i, c := range []struct {
		name   string
		hello  *latchkeyv1.Hello
		pcr11  []byte
		hasKey bool
	}{
		{"join", joinHello(), pcr11Quoted, true},
		{"rejoin", rejoinHello(), pcr11Quoted, true},
		{"reattest", reattestHello(), pcr11Join, false},
	} {
		tk := mustTicket(t, e, c.hello)
		g := tk.GetOfflineGrant()
		switch {
		case g == nil:
			t.Fatalf("%s: no grant", c.name)
		case !bytes.Equal(g.GetPolicyRef(), ref) || g.GetResetCount() != 17 || g.GetClockMs() != 987654321 ||
			g.GetMaxBoots() != 3 || g.GetMaxHours() != 72 || len(g.GetPcrs()) != 2 || !bytes.Equal(g.GetPcrs()[7], pcr7):
			t.Fatalf("%s: grant %+v", c.name, g)
		case !bytes.Equal(g.GetPcrs()[11], c.pcr11):
			t.Fatalf("%s: pcr 11 %x, want %x", c.name, g.GetPcrs()[11], c.pcr11)
		case tk.GetWithdrawOffline():
			t.Fatalf("%s: a granting ticket withdraws", c.name)
		case (len(tk.GetDiskKey()) == 32) != c.hasKey:
			t.Fatalf("%s: disk key of %d bytes", c.name, len(tk.GetDiskKey()))
		}
		if got := sample(t, m, "latchkey_verifier_offline_grants_total", "event=granted"); got != float64(i+1) {
			t.Fatalf("%s: granted = %v", c.name, got)
		}
	}
	logs := e.logs.String()
	want := `msg="offline grant" node=node-1 disk_uuid=` + diskA + ` purpose=reattest identity=` + offlineMachine +
		` offline_max_boots=3 offline_max_hours=72 sealed_pcrs=7,11 tpm_reset_count=17 tpm_clock_ms=987654321`
	if !strings.Contains(logs, want) {
		t.Fatalf("audit: want %q in\n%s", want, logs)
	}
}

// Off (no offlineUnlock), there is no grant, and a node that says it
// holds one is told to withdraw it; a node that holds none is not told.
func TestNoOfflineGrantWhenOff(t *testing.T) {
	sg, m := &fakeSigner{}, metrics.New()
	e := startVerifier(t, envOpt{val: newSealing(offlineMachine), grants: sg, metrics: m})
	tk := mustTicket(t, e, joinHello())
	if tk.GetOfflineGrant() != nil || tk.GetWithdrawOffline() {
		t.Fatalf("off: grant %v withdraw %v", tk.GetOfflineGrant(), tk.GetWithdrawOffline())
	}
	for _, h := range []*latchkeyv1.Hello{rejoinHello(), reattestHello()} {
		h.Offline = &latchkeyv1.OfflineState{Held: true}
		tk := mustTicket(t, e, h)
		if tk.GetOfflineGrant() != nil || !tk.GetWithdrawOffline() {
			t.Fatalf("%s holding a grant: grant %v withdraw %v", h.GetPurpose(), tk.GetOfflineGrant(), tk.GetWithdrawOffline())
		}
	}
	if len(sg.reqs) != 0 {
		t.Fatalf("signed %d grants with offline unlock off", len(sg.reqs))
	}
	if got := sample(t, m, "latchkey_verifier_offline_grants_total", "event=withdrawn"); got != 2 {
		t.Fatalf("withdrawn = %v, want 2", got)
	}
	if !strings.Contains(e.logs.String(), `msg="offline grant withdrawn" node=node-1 disk_uuid=`+diskA+` purpose=join reason="the policy no longer allows offline unlock"`) {
		t.Fatalf("audit:\n%s", e.logs)
	}
}

// A re-attestation whose PCR 11 join point is not derivable renews
// nothing and withdraws nothing, and says why; joins still get grants.
func TestReattestWithoutJoinPointRenewsNothing(t *testing.T) {
	v := newSealing(offlineMachine)
	v.noJoinPoint = true
	e := startVerifier(t, envOpt{val: v, grants: &fakeSigner{}, offline: bounds})
	if tk := mustTicket(t, e, joinHello()); tk.GetOfflineGrant() == nil {
		t.Fatal("join: no grant")
	}
	tk := mustTicket(t, e, reattestHello())
	if tk.GetOfflineGrant() != nil || tk.GetWithdrawOffline() {
		t.Fatalf("reattest: grant %v withdraw %v", tk.GetOfflineGrant(), tk.GetWithdrawOffline())
	}
	want := `msg="no offline grant from this attestation" node=node-1 disk_uuid=` + diskA +
		` purpose=reattest reason="pcr 11 join point unknown"`
	if !strings.Contains(e.logs.String(), want) {
		t.Fatalf("audit: want %q in\n%s", want, e.logs)
	}
}

// Evidence that cannot seal (SEV-SNP, here the plain fake) gets no grant
// even where the snapshot allows one, with a log line.
func TestNoOfflineGrantWithoutSealer(t *testing.T) {
	e := startVerifier(t, envOpt{grants: &fakeSigner{}, offline: bounds})
	if tk := mustTicket(t, e, joinHello()); tk.GetOfflineGrant() != nil {
		t.Fatal("grant for evidence that cannot seal")
	}
	if !strings.Contains(e.logs.String(), `msg="no offline grant: the evidence cannot seal a key"`) {
		t.Fatalf("audit:\n%s", e.logs)
	}
}

// Each refusal that withdraws the grant carries the flag; refusals of
// evidence that proves nothing about the node (replayed, malformed) do
// not, so nobody can withdraw another node's grant by sending junk.
func TestRefusalsWithdrawOffline(t *testing.T) {
	src, m := &swapPolicy{}, metrics.New()
	e := startVerifier(t, envOpt{val: newSealing(offlineMachine), grants: &fakeSigner{}, offline: bounds, policy: src, metrics: m})
	mustTicket(t, e, joinHello()) // binds node-1 and the disk to offlineMachine
	base := *src.Current()
	install := func(edit func(*policy.Snapshot)) {
		next := base
		next.Validators = map[latchkeyv1.Variant]attest.Validator{latchkeyv1.Variant_VARIANT_TPM: newSealing(offlineMachine)}
		edit(&next)
		src.cur.Store(&next)
	}
	check := func(name string, h *latchkeyv1.Hello, reason latchkeyv1.Reason, withdraw bool) {
		t.Helper()
		_, r := round(t, e, h)
		if r == nil || r.GetReason() != reason || r.GetWithdrawOffline() != withdraw {
			t.Fatalf("%s: refusal %v, want %v with withdraw_offline=%v", name, r, reason, withdraw)
		}
	}
	install(func(s *policy.Snapshot) {
		v := newSealing(offlineMachine)
		v.PolicyRefusal = latchkeyv1.Reason_PCR_MISMATCH
		s.Validators[latchkeyv1.Variant_VARIANT_TPM] = v
	})
	check("policy refusal", rejoinHello(), latchkeyv1.Reason_PCR_MISMATCH, true)
	check("policy refusal at re-attestation", reattestHello(), latchkeyv1.Reason_PCR_MISMATCH, true)
	// A node that says it holds a grant has its withdrawal audited and
	// counted; one that holds none is told all the same.
	held := reattestHello()
	held.Offline = &latchkeyv1.OfflineState{Held: true}
	check("policy refusal of a holder", held, latchkeyv1.Reason_PCR_MISMATCH, true)
	if got := sample(t, m, "latchkey_verifier_offline_grants_total", "event=withdrawn"); got != 1 {
		t.Fatalf("withdrawn = %v, want 1", got)
	}
	if want := `msg="offline grant withdrawn" node=node-1 disk_uuid=` + diskA + ` purpose=reattest reason="refused: PCR_MISMATCH"`; !strings.Contains(e.logs.String(), want) {
		t.Fatalf("audit: want %q in\n%s", want, e.logs)
	}
	install(func(s *policy.Snapshot) {
		d, err := policy.Load([]byte("apiVersion: latchkey/v1\ntpm: {}\ndeny:\n  nodeNames: [node-1]\n"), policy.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		s.Deny = d.Deny
	})
	check("revoked", rejoinHello(), latchkeyv1.Reason_REVOKED, true)
	install(func(s *policy.Snapshot) {
		s.Validators[latchkeyv1.Variant_VARIANT_TPM] = newSealing("tpm-ek:sha256:0b0b")
	})
	check("another machine", rejoinHello(), latchkeyv1.Reason_IDENTITY_MISMATCH, true)
	install(func(*policy.Snapshot) {})
	retired := rejoinHello()
	retired.DiskKeyGeneration = new(uint32(7))
	check("retired generation", retired, latchkeyv1.Reason_KEY_GENERATION_RETIRED, true)
	install(func(s *policy.Snapshot) { delete(s.Validators, latchkeyv1.Variant_VARIANT_TPM) })
	check("variant no longer enabled", rejoinHello(), latchkeyv1.Reason_UNKNOWN_VARIANT, true)

	// What slips past: evidence replayed from another session, and junk.
	install(func(*policy.Snapshot) {})
	s1 := rawStream(t, e)
	h := rejoinHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s1, h))
	s2 := rawStream(t, e)
	if err := s2.Send(helloMsg(h)); err != nil {
		t.Fatal(err)
	}
	_, err := s2.Recv()
	if r := refusalDetail(t, err); r.GetReason() != latchkeyv1.Reason_BINDING_MISMATCH || r.GetWithdrawOffline() {
		t.Fatalf("replayed evidence: %v", r)
	}
	s3 := rawStream(t, e)
	junk := rejoinHello()
	junk.Evidence = []byte("junk")
	if err := s3.Send(helloMsg(junk)); err != nil {
		t.Fatal(err)
	}
	_, err = s3.Recv()
	if r := refusalDetail(t, err); r.GetReason() != latchkeyv1.Reason_MALFORMED || r.GetWithdrawOffline() {
		t.Fatalf("junk evidence: %v", r)
	}
}

// A disk keyed under an older generation (the master secret rotated):
// the ticket withdraws the grant sealed under the old key and carries a
// new one; a disk on the current generation is not told to withdraw, nor
// a node that holds no grant.
func TestRotationWithdrawsOffline(t *testing.T) {
	d, err := keys.NewGenerations([]keys.Secret{{Generation: 0, Bytes: bytes.Repeat([]byte{1}, 32)},
		{Generation: 1, Bytes: bytes.Repeat([]byte{2}, 32)}}, 1, []byte("test-cluster"))
	if err != nil {
		t.Fatal(err)
	}
	e := startVerifier(t, envOpt{val: newSealing(offlineMachine), grants: &fakeSigner{}, offline: bounds, keys: d})
	old := joinHello()
	old.DiskKeyGeneration = new(uint32(0))
	old.Offline = &latchkeyv1.OfflineState{Held: true}
	tk := mustTicket(t, e, old)
	if !tk.GetWithdrawOffline() || tk.GetOfflineGrant() == nil || len(tk.GetPreviousDiskKey()) != 32 {
		t.Fatalf("old generation: withdraw %v grant %v previous key %d bytes", tk.GetWithdrawOffline(), tk.GetOfflineGrant() != nil, len(tk.GetPreviousDiskKey()))
	}
	cur := rejoinHello()
	cur.DiskKeyGeneration = new(uint32(1))
	cur.Offline = &latchkeyv1.OfflineState{Held: true}
	if tk := mustTicket(t, e, cur); tk.GetWithdrawOffline() || tk.GetOfflineGrant() == nil {
		t.Fatalf("current generation: withdraw %v grant %v", tk.GetWithdrawOffline(), tk.GetOfflineGrant() != nil)
	}
	none := rejoinHello()
	none.DiskKeyGeneration = new(uint32(0))
	if tk := mustTicket(t, e, none); tk.GetWithdrawOffline() {
		t.Fatal("old generation, no grant held: told to withdraw")
	}
}

// Hello.offline: a withdrawal is confirmed in the audit; an offline boot
// is audited, counted and recorded for the offline taint, except by the
// re-attestation that clears it; a claim in unverified evidence is
// neither recorded nor counted.
func TestHelloOfflineIsAuditedAndRecorded(t *testing.T) {
	var os *offlineStore
	m := metrics.New()
	e := startVerifier(t, envOpt{val: newSealing(offlineMachine), grants: &fakeSigner{}, offline: bounds, metrics: m,
		minter: &fakeMinter{}, store: func(s binding.Store) binding.Store {
			os = &offlineStore{recordingStore: &recordingStore{Store: s}}
			return os
		}})
	mustTicket(t, e, joinHello())
	booted := &latchkeyv1.OfflineState{Held: true, BootedOffline: true, Boot: 2, MaxBoots: 3}

	junk := rejoinHello()
	junk.Offline = booted
	s := rawStream(t, e)
	junk.Evidence = []byte("junk")
	if err := s.Send(helloMsg(junk)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err == nil {
		t.Fatal("junk evidence accepted")
	}
	if os.bootsRecorded() != 0 || sample(t, m, "latchkey_verifier_offline_grants_total", "event=booted_offline") != 0 {
		t.Fatal("an unverified offline claim was recorded")
	}

	rj := rejoinHello()
	rj.Offline = booted
	mustTicket(t, e, rj)
	if os.bootsRecorded() != 1 || sample(t, m, "latchkey_verifier_offline_grants_total", "event=booted_offline") != 1 {
		t.Fatalf("rejoin after an offline boot: %d recorded", os.bootsRecorded())
	}
	want := `msg="node booted offline" node=node-1 disk_uuid=` + diskA + ` identity=` + offlineMachine + ` offline_boot=2 offline_max_boots=3 purpose=join`
	if !strings.Contains(e.logs.String(), want) {
		t.Fatalf("audit: want %q in\n%s", want, e.logs)
	}
	ra := reattestHello()
	ra.Offline = booted
	mustTicket(t, e, ra)
	if os.bootsRecorded() != 1 || sample(t, m, "latchkey_verifier_offline_grants_total", "event=booted_offline") != 2 {
		t.Fatalf("the clearing re-attestation recorded an offline boot (%d)", os.bootsRecorded())
	}
	if n := len(os.recorded()); n != 1 || os.recorded()[0].Decision != binding.DecisionAttested {
		t.Fatalf("re-attestations recorded: %+v", os.recorded())
	}

	wd := rejoinHello()
	wd.Offline = &latchkeyv1.OfflineState{Withdrawn: true}
	mustTicket(t, e, wd)
	if !strings.Contains(e.logs.String(), `msg="offline grant withdrawal confirmed" node=node-1 disk_uuid=`+diskA+` identity=`+offlineMachine) {
		t.Fatalf("audit:\n%s", e.logs)
	}
}
