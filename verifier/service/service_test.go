package service_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/internal/logtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/keys"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/policy/policytest"
	"github.com/latchkey/latchkey/verifier/service"
	"github.com/latchkey/latchkey/verifier/servingcert"
	"github.com/latchkey/latchkey/verifier/token"
)

const diskA = "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e"

// fakeMinter records mints and revokes; Fail makes Mint fail.
type fakeMinter struct {
	mu      sync.Mutex
	live    map[string]bool
	minted  int
	revoked []string
	Fail    bool
}

func (m *fakeMinter) Mint(_ context.Context, r token.Request) (*token.Grant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail {
		return nil, errors.New("apiserver down")
	}
	m.minted++
	id := "abcdef"[:6]
	if m.live == nil {
		m.live = map[string]bool{}
	}
	m.live[id] = true
	return &token.Grant{ID: id, Token: id + ".0123456789abcdef", Expiry: time.Now().Add(time.Hour),
		Endpoints: []string{"10.0.0.1:6443"}, CACertHashes: []string{"sha256:" + strings.Repeat("ab", 32)}}, nil
}

func (m *fakeMinter) Revoke(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, id)
	m.revoked = append(m.revoked, id)
	return nil
}

func (m *fakeMinter) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

type env struct {
	addr   string
	pin    atls.Pin
	minter *fakeMinter
	logs   *logtest.Buffer
}

type envOpt struct {
	challenge    bool
	controlPlane bool
	minter       *fakeMinter
	ackTimeout   time.Duration
	// store wraps the binding store the verifier uses.
	store func(binding.Store) binding.Store
	// maxInFlight is the admission limit (0: the default).
	maxInFlight int
	metrics     *metrics.Metrics
	// keys replaces the single-generation deriver.
	keys *keys.Deriver
	// bindings receives the binding store the verifier uses.
	bindings *binding.Store
	// challengeTimeout bounds each challenge wait (0: the default).
	challengeTimeout time.Duration
	// policy, when set, is the verifier's policy source; startVerifier
	// installs the test snapshot in it, and a test swaps it later.
	policy *swapPolicy
	// validator, when set, replaces the TPM validator built from challenge.
	validator *attesttest.Validator
	// next, when set, is the candidate policy (Config.PolicyNext).
	next *policy.Snapshot
	// val, when set, replaces every other validator (offline_test.go).
	val attest.Validator
	// grants is Config.Grants; offline the TPM variant's offlineUnlock.
	grants  service.GrantSigner
	offline *policy.OfflineUnlock
}

// swapPolicy is a policy source a test changes while the verifier runs.
type swapPolicy struct {
	cur atomic.Pointer[policy.Snapshot]
}

func (p *swapPolicy) Current() *policy.Snapshot { return p.cur.Load() }

// set installs a copy of the snapshot in force with deny (a deny:
// section in policy-file YAML, "" for none) and the validator's machine
// identity set to id ("" for the default).
func (p *swapPolicy) set(t *testing.T, deny, id string) {
	t.Helper()
	next := *p.Current()
	next.Deny = nil
	if deny != "" {
		loaded, err := policy.Load([]byte("apiVersion: latchkey/v1\ntpm: {}\ndeny:\n"+deny), policy.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		next.Deny = loaded.Deny
	}
	v := *next.Validators[latchkeyv1.Variant_VARIANT_TPM].(*attesttest.Validator)
	v.MachineID = id
	next.Validators = map[latchkeyv1.Variant]attest.Validator{latchkeyv1.Variant_VARIANT_TPM: &v}
	p.cur.Store(&next)
}

func startVerifier(t *testing.T, o envOpt) *env {
	t.Helper()
	cert, err := servingcert.LoadOrCreate(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d, _ := keys.NewDeriver(bytes.Repeat([]byte{9}, 32), []byte("test-cluster"))
	if o.keys != nil {
		d = o.keys
	}
	val := &attesttest.Validator{Challenge: o.challenge}
	if o.validator != nil {
		val = o.validator
	}
	snap := &policy.Snapshot{
		Digest:       "sha256:test",
		Validators:   map[latchkeyv1.Variant]attest.Validator{latchkeyv1.Variant_VARIANT_TPM: val},
		ControlPlane: map[latchkeyv1.Variant]bool{latchkeyv1.Variant_VARIANT_TPM: o.controlPlane},
	}
	if o.val != nil {
		snap.Validators[latchkeyv1.Variant_VARIANT_TPM] = o.val
	}
	if o.offline != nil {
		snap.Offline = map[latchkeyv1.Variant]policy.OfflineUnlock{latchkeyv1.Variant_VARIANT_TPM: *o.offline}
	}
	logs := &logtest.Buffer{}
	var store binding.Store
	store, err = binding.NewDir(binding.DirConfig{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if o.store != nil {
		store = o.store(store)
	}
	if o.bindings != nil {
		*o.bindings = store
	}
	var src policy.Source = policytest.Static(snap)
	if o.policy != nil {
		o.policy.cur.Store(snap)
		src = o.policy
	}
	cfg := service.Config{Policy: src, Keys: d, Bindings: store,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), AckTimeout: o.ackTimeout,
		MaxInFlight: o.maxInFlight, Metrics: o.metrics, ChallengeTimeout: o.challengeTimeout, Grants: o.grants}
	if o.minter != nil {
		cfg.Minter = o.minter
	}
	if o.next != nil {
		cfg.PolicyNext = policytest.Static(o.next)
	}
	svc, err := service.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := service.NewGRPCServer(svc, cert)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	pins, _ := servingcert.Pins(cert)
	return &env{addr: lis.Addr().String(), pin: pins[0], minter: o.minter, logs: logs}
}

func client(t *testing.T, e *env, iss attest.Issuer) *ticket.Client {
	t.Helper()
	c, err := ticket.New(ticket.Config{Endpoints: []string{e.addr}, Pins: []atls.Pin{e.pin}, Issuer: iss,
		Timeout: 20 * time.Second, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, RefusalBackoff: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// clientOnce gives up after its first attempt, however long that takes,
// so a refusal test does not depend on the machine's speed.
func clientOnce(t *testing.T, e *env, iss attest.Issuer) *ticket.Client {
	t.Helper()
	c, err := ticket.New(ticket.Config{Endpoints: []string{e.addr}, Pins: []atls.Pin{e.pin}, Issuer: iss,
		Timeout: 20 * time.Second, Sleep: func(context.Context, time.Duration) error { return context.Canceled },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func worker(uuid string) ticket.Request {
	return ticket.Request{NodeName: "node-1", DiskUUID: uuid, Role: latchkeyv1.Role_ROLE_WORKER}
}

func TestJoinDiskOnlySameKeyTwice(t *testing.T) {
	e := startVerifier(t, envOpt{challenge: true})
	c := client(t, e, &attesttest.Issuer{})
	t1, err := c.Get(context.Background(), worker(diskA))
	if err != nil {
		t.Fatal(err)
	}
	t2, err := c.Get(context.Background(), worker(diskA))
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.Get(context.Background(), worker("00000000-0000-4000-8000-000000000001"))
	if err != nil {
		t.Fatal(err)
	}
	if len(t1.DiskKey) != 32 || !bytes.Equal(t1.DiskKey, t2.DiskKey) || bytes.Equal(t1.DiskKey, other.DiskKey) {
		t.Fatal("disk keys: want 32 bytes, equal for one uuid, different across uuids")
	}
	if t1.Token != "" {
		t.Fatal("disk-only mode issued a token")
	}
	if !strings.Contains(e.logs.String(), "result=accepted") || strings.Contains(e.logs.String(), string(t1.DiskKey)) {
		t.Fatalf("audit log: want accepted lines and no key:\n%s", e.logs)
	}
}

func TestJoinTokenRules(t *testing.T) {
	m := &fakeMinter{}
	e := startVerifier(t, envOpt{minter: m})
	c := client(t, e, &attesttest.Issuer{})
	first, err := c.Get(context.Background(), worker(diskA))
	if err != nil || first.Token == "" || len(first.CaCertHashes) != 1 {
		t.Fatalf("first join: token %q hashes %v err %v", first.GetToken(), first.GetCaCertHashes(), err)
	}
	rejoin := worker(diskA)
	rejoin.Rejoin = true
	r, err := c.Get(context.Background(), rejoin)
	if err != nil || r.Token != "" {
		t.Fatalf("rejoin without request_token: token %q err %v", r.GetToken(), err)
	}
	rejoin.RequestToken = true
	r, err = c.Get(context.Background(), rejoin)
	if err != nil || r.Token == "" {
		t.Fatalf("rejoin with request_token: token %q err %v", r.GetToken(), err)
	}
	if m.minted != 2 || len(m.revoked) != 0 {
		t.Fatalf("minted %d revoked %v, want 2 and none", m.minted, m.revoked)
	}
}

func refusal(t *testing.T, err error) latchkeyv1.Reason {
	t.Helper()
	var r *ticket.RefusedError
	if !errors.As(err, &r) {
		t.Fatalf("err = %v, want a refusal", err)
	}
	return r.Reason
}

func TestWrongChallengeAnswerRefused(t *testing.T) {
	m := &fakeMinter{}
	e := startVerifier(t, envOpt{challenge: true, minter: m})
	_, err := clientOnce(t, e, &attesttest.Issuer{WrongAnswer: true}).Get(context.Background(), worker(diskA))
	if got := refusal(t, err); got != latchkeyv1.Reason_ACTIVATION_FAILED {
		t.Fatalf("reason = %v, want ACTIVATION_FAILED", got)
	}
	if m.minted != 0 || !strings.Contains(e.logs.String(), "reason=ACTIVATION_FAILED") {
		t.Fatalf("minted %d; audit:\n%s", m.minted, e.logs)
	}
}

func TestUnknownVariantRefused(t *testing.T) {
	e := startVerifier(t, envOpt{})
	_, err := clientOnce(t, e, &attesttest.Issuer{V: latchkeyv1.Variant_VARIANT_SNP}).Get(context.Background(), worker(diskA))
	if got := refusal(t, err); got != latchkeyv1.Reason_UNKNOWN_VARIANT {
		t.Fatalf("reason = %v, want UNKNOWN_VARIANT", got)
	}
}

func TestControlPlaneNeedsPolicy(t *testing.T) {
	m := &fakeMinter{}
	e := startVerifier(t, envOpt{minter: m})
	req := worker(diskA)
	req.Role = latchkeyv1.Role_ROLE_CONTROL_PLANE
	_, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), req)
	if got := refusal(t, err); got != latchkeyv1.Reason_ROLE_NOT_ALLOWED {
		t.Fatalf("reason = %v, want ROLE_NOT_ALLOWED", got)
	}
	if m.minted != 0 {
		t.Fatal("a token was minted for a refused role")
	}
}

func TestMintFailureIsTransientAndLeavesNothing(t *testing.T) {
	m := &fakeMinter{Fail: true}
	e := startVerifier(t, envOpt{minter: m})
	_, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), worker(diskA))
	if !errors.Is(err, ticket.ErrUnreachable) || refusal(t, err) != latchkeyv1.Reason_UNAVAILABLE {
		t.Fatalf("err = %v, want unreachable after UNAVAILABLE", err)
	}
	if len(m.revoked) != 0 {
		t.Fatal("a failed mint revoked something")
	}
}

func TestPinMismatchSendsNoEvidence(t *testing.T) {
	e := startVerifier(t, envOpt{})
	iss := &attesttest.Issuer{}
	wrong := e.pin
	wrong[0] ^= 1
	c, _ := ticket.New(ticket.Config{Endpoints: []string{e.addr}, Pins: []atls.Pin{wrong}, Issuer: iss,
		Timeout: 20 * time.Second, Sleep: func(context.Context, time.Duration) error { return context.Canceled },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	_, err := c.Get(context.Background(), worker(diskA))
	if !errors.Is(err, atls.ErrPinMismatch) || errors.Is(err, ticket.ErrUnreachable) || !strings.Contains(err.Error(), "matches no configured pin") {
		t.Fatalf("err = %v, want pin mismatch (and not unreachable)", err)
	}
	if iss.Calls.Load() != 0 || strings.Contains(e.logs.String(), "join decision") {
		t.Fatalf("evidence made %d times; verifier log:\n%s", iss.Calls.Load(), e.logs)
	}
}

func TestNoPinRefusedUnlessInsecure(t *testing.T) {
	_, err := ticket.New(ticket.Config{Endpoints: []string{"127.0.0.1:1"}, Issuer: &attesttest.Issuer{}})
	if err == nil || !strings.Contains(err.Error(), "insecure-skip-verifier-auth") {
		t.Fatalf("err = %v, want refusal without pin", err)
	}
	if _, err := ticket.New(ticket.Config{Endpoints: []string{"127.0.0.1:1"}, Issuer: &attesttest.Issuer{}, InsecureSkipVerifierAuth: true}); err != nil {
		t.Fatal(err)
	}
}

// rawStream opens a Join stream without the ticket client, for tests that
// send what a well-behaved agent never would.
func rawStream(t *testing.T, e *env) latchkeyv1.JoinService_JoinClient {
	t.Helper()
	cfg, _ := atls.ClientConfig([]atls.Pin{e.pin}, false)
	conn, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDisableRetry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s, err := latchkeyv1.NewJoinServiceClient(conn).Join(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bindingOf(t *testing.T, s latchkeyv1.JoinService_JoinClient, h *latchkeyv1.Hello) []byte {
	t.Helper()
	b, err := atls.PeerBinding(s.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func helloMsg(h *latchkeyv1.Hello) *latchkeyv1.AgentMessage {
	return &latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_Hello{Hello: h}}
}

func fakeEvidence(t *testing.T, binding []byte) []byte {
	a, _ := (&attesttest.Issuer{}).Attest(context.Background(), binding)
	return a.Evidence()
}

func statusReason(t *testing.T, err error) (codes.Code, latchkeyv1.Reason) {
	t.Helper()
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if r, ok := d.(*latchkeyv1.Refusal); ok {
			return st.Code(), r.GetReason()
		}
	}
	t.Fatalf("status %v carries no Refusal", err)
	return 0, 0
}

func baseHello() *latchkeyv1.Hello {
	return &latchkeyv1.Hello{NodeName: "node-1", DiskUuid: diskA, Role: latchkeyv1.Role_ROLE_WORKER, Variant: latchkeyv1.Variant_VARIANT_TPM}
}

func TestReplayedEvidenceRefused(t *testing.T) {
	e := startVerifier(t, envOpt{})
	s1 := rawStream(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s1, h))
	s2 := rawStream(t, e)
	if err := s2.Send(helloMsg(h)); err != nil {
		t.Fatal(err)
	}
	_, err := s2.Recv()
	if code, r := statusReason(t, err); r != latchkeyv1.Reason_BINDING_MISMATCH || code != codes.PermissionDenied {
		t.Fatalf("got %v %v, want PermissionDenied BINDING_MISMATCH", code, r)
	}
}

func TestEditedHelloRefused(t *testing.T) {
	for name, edit := range map[string]func(*latchkeyv1.Hello){
		"node name": func(h *latchkeyv1.Hello) { h.NodeName = "node-2" },
		"disk uuid": func(h *latchkeyv1.Hello) { h.DiskUuid = "00000000-0000-4000-8000-000000000001" },
		"rejoin":    func(h *latchkeyv1.Hello) { h.Rejoin = true },
	} {
		t.Run(name, func(t *testing.T) {
			e := startVerifier(t, envOpt{})
			s := rawStream(t, e)
			h := baseHello()
			h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
			edit(h)
			s.Send(helloMsg(h))
			_, err := s.Recv()
			if _, r := statusReason(t, err); r != latchkeyv1.Reason_BINDING_MISMATCH {
				t.Fatalf("reason %v, want BINDING_MISMATCH", r)
			}
		})
	}
}

func TestMalformedInputRefused(t *testing.T) {
	cases := map[string]struct {
		msg  *latchkeyv1.AgentMessage
		want string
	}{
		"not a hello":         {&latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_TicketAck{TicketAck: &latchkeyv1.TicketAck{}}}, "first message is not a Hello"},
		"bad node name":       {helloMsg(&latchkeyv1.Hello{NodeName: "Node_1!", DiskUuid: diskA, Role: 1, Variant: 1, Evidence: []byte("x")}), "not a DNS-1123"},
		"upper uuid":          {helloMsg(&latchkeyv1.Hello{NodeName: "n", DiskUuid: strings.ToUpper(diskA), Role: 1, Variant: 1, Evidence: []byte("x")}), "canonical"},
		"no role":             {helloMsg(&latchkeyv1.Hello{NodeName: "n", DiskUuid: diskA, Variant: 1, Evidence: []byte("x")}), "role 0"},
		"no evidence":         {helloMsg(&latchkeyv1.Hello{NodeName: "n", DiskUuid: diskA, Role: 1, Variant: 1}), "no evidence"},
		"evidence over limit": {helloMsg(&latchkeyv1.Hello{NodeName: "n", DiskUuid: diskA, Role: 1, Variant: 1, Evidence: make([]byte, service.MaxEvidenceSize+1)}), "limit 262144"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			e := startVerifier(t, envOpt{})
			s := rawStream(t, e)
			s.Send(c.msg)
			_, err := s.Recv()
			code, r := statusReason(t, err)
			if r != latchkeyv1.Reason_MALFORMED || code != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v %v %v, want InvalidArgument MALFORMED containing %q", code, r, err, c.want)
			}
		})
	}
}

func TestOversizedMessageRefusedByTransport(t *testing.T) {
	e := startVerifier(t, envOpt{})
	s := rawStream(t, e)
	h := baseHello()
	h.Evidence = make([]byte, service.MaxMessageSize+1)
	s.Send(helloMsg(h))
	_, err := s.Recv()
	// codec.go: refused by the handler with a Refusal, not by grpc.
	if code, r := statusReason(t, err); code != codes.InvalidArgument || r != latchkeyv1.Reason_MALFORMED ||
		!strings.Contains(err.Error(), "bytes, limit 270336") {
		t.Fatalf("err = %v, want InvalidArgument MALFORMED naming the limit", err)
	}
}

func TestUnacknowledgedTicketRevokesToken(t *testing.T) {
	m := &fakeMinter{}
	e := startVerifier(t, envOpt{minter: m, ackTimeout: 200 * time.Millisecond})
	s := rawStream(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	s.Send(helloMsg(h))
	got, err := s.Recv()
	if err != nil || got.GetTicket().GetToken() == "" {
		t.Fatalf("want a ticket with a token, got %v %v", got, err)
	}
	// The agent goes away without acknowledging.
	s.CloseSend()
	_, err = s.Recv()
	if _, r := statusReason(t, err); r != latchkeyv1.Reason_UNAVAILABLE {
		t.Fatalf("reason %v, want UNAVAILABLE", r)
	}
	deadline := time.Now().Add(2 * time.Second)
	for m.liveCount() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if m.liveCount() != 0 || len(m.revoked) != 1 || !strings.Contains(e.logs.String(), "result=handover_failed") {
		t.Fatalf("live %d revoked %v; log:\n%s", m.liveCount(), m.revoked, e.logs)
	}
}

// brokenStore fails the operations named.
type brokenStore struct {
	binding.Store
	get, setToken bool
}

var errStoreDown = errors.New("apiserver down")

func (b *brokenStore) Get(ctx context.Context, k binding.Kind, n string) (binding.Record, error) {
	if b.get {
		return binding.Record{}, errStoreDown
	}
	return b.Store.Get(ctx, k, n)
}

func (b *brokenStore) SetToken(ctx context.Context, node, id, tok string) error {
	if b.setToken {
		return errStoreDown
	}
	return b.Store.SetToken(ctx, node, id, tok)
}

// An unreadable binding store is transient: nothing is derived or minted.
func TestBindingStoreDownIsTransient(t *testing.T) {
	m := &fakeMinter{}
	e := startVerifier(t, envOpt{minter: m, store: func(s binding.Store) binding.Store { return &brokenStore{Store: s, get: true} }})
	_, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), worker(diskA))
	if got := refusal(t, err); got != latchkeyv1.Reason_UNAVAILABLE || !strings.Contains(err.Error(), "disk binding record") {
		t.Fatalf("err = %v, want UNAVAILABLE naming the binding record", err)
	}
	if m.minted != 0 {
		t.Fatal("a token was minted without a binding check")
	}
}

// A token whose ID cannot be written to the node's binding is revoked:
// the approver would never sign its CSR, and nobody else can name it.
func TestTokenNotRecordedIsRevoked(t *testing.T) {
	m := &fakeMinter{}
	e := startVerifier(t, envOpt{minter: m, store: func(s binding.Store) binding.Store { return &brokenStore{Store: s, setToken: true} }})
	_, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), worker(diskA))
	if got := refusal(t, err); got != latchkeyv1.Reason_UNAVAILABLE || !strings.Contains(err.Error(), "record token on node binding") {
		t.Fatalf("err = %v, want UNAVAILABLE", err)
	}
	if m.minted != 1 || len(m.revoked) != 1 || m.liveCount() != 0 {
		t.Fatalf("minted %d revoked %v live %d", m.minted, m.revoked, m.liveCount())
	}
}

// In disk-only mode only the disk is bound: the node name is free text
// there (no token, no kubelet identity).
func TestDiskOnlyBindsDiskOnly(t *testing.T) {
	var inner binding.Store
	e := startVerifier(t, envOpt{store: func(s binding.Store) binding.Store { inner = s; return s }})
	if _, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), worker(diskA)); err != nil {
		t.Fatal(err)
	}
	rs, err := inner.List(context.Background())
	if err != nil || len(rs) != 1 || rs[0].Kind != binding.Disk || rs[0].Identity != "fake:machine" {
		t.Fatalf("records %+v %v", rs, err)
	}
}
