package boot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/ticket"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

type fakeDisk struct {
	plan      disk.Plan
	creds     bool
	openErr   error
	keySeen   []byte
	keyPassed []byte
}

func (d *fakeDisk) Prepare(context.Context) (disk.Plan, error) { return d.plan, nil }
func (d *fakeDisk) Open(_ context.Context, _ disk.Plan, keys disk.Keys) (disk.Result, error) {
	d.keySeen = append([]byte{}, keys.Current...)
	d.keyPassed = keys.Current
	return disk.Result{HasKubeletCredentials: d.creds}, d.openErr
}

type fakeTickets struct {
	reqs  []ticket.Request
	token func(ticket.Request) string
	err   error
}

func (f *fakeTickets) Get(_ context.Context, r ticket.Request) (*latchkeyv1.Ticket, error) {
	f.reqs = append(f.reqs, r)
	if f.err != nil {
		return nil, f.err
	}
	tok := ""
	if f.token != nil {
		tok = f.token(r)
	}
	return &latchkeyv1.Ticket{DiskKey: make([]byte, 32), Token: tok}, nil
}

type fakeJoiner struct {
	calls    int
	failures int // the first failures attempts fail
	tickets  []*latchkeyv1.Ticket
}

func (j *fakeJoiner) Join(_ context.Context, t *latchkeyv1.Ticket) error {
	j.calls++
	j.tickets = append(j.tickets, t)
	if t.GetToken() == "" {
		return errors.New("no token")
	}
	if j.calls <= j.failures {
		return fmt.Errorf("kubeadm join failed (attempt %d)", j.calls)
	}
	return nil
}

// sleeps records the waits between join attempts instead of waiting.
type sleeps struct {
	got []time.Duration
	err error
}

func (s *sleeps) sleep(_ context.Context, d time.Duration) error {
	s.got = append(s.got, d)
	return s.err
}

func firstJoinToken(r ticket.Request) string {
	if !r.Rejoin || r.RequestToken {
		return "abcdef.0123456789abcdef"
	}
	return ""
}

func run(t *testing.T, d *fakeDisk, tk *fakeTickets, j Joiner, mod ...func(*Config)) error {
	t.Helper()
	cfg := Config{NodeName: "n1", Role: latchkeyv1.Role_ROLE_WORKER, Disk: d, Tickets: tk, Joiner: j,
		Logger: slog.New(slog.DiscardHandler), Sleep: (&sleeps{}).sleep}
	for _, m := range mod {
		m(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b.Run(context.Background())
}

func TestFirstBootJoinsOnceAndClearsKey(t *testing.T) {
	d, tk, j := &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeTickets{token: firstJoinToken}, &fakeJoiner{}
	if err := run(t, d, tk, j); err != nil {
		t.Fatal(err)
	}
	if j.calls != 1 || len(tk.reqs) != 1 || tk.reqs[0].Rejoin {
		t.Fatalf("joins %d requests %+v", j.calls, tk.reqs)
	}
	if len(d.keySeen) != 32 || strings.Trim(string(d.keyPassed), "\x00") != "" {
		t.Fatal("disk key was not passed or not cleared")
	}
}

func TestRebootWithCredentialsSkipsJoin(t *testing.T) {
	d, tk, j := &fakeDisk{plan: disk.Plan{UUID: "u", Rejoin: true}, creds: true}, &fakeTickets{token: firstJoinToken}, &fakeJoiner{}
	if err := run(t, d, tk, j); err != nil {
		t.Fatal(err)
	}
	if j.calls != 0 || len(tk.reqs) != 1 || !tk.reqs[0].Rejoin || tk.reqs[0].RequestToken {
		t.Fatalf("joins %d requests %+v", j.calls, tk.reqs)
	}
}

func TestRebootWithoutCredentialsAsksForToken(t *testing.T) {
	d, tk, j := &fakeDisk{plan: disk.Plan{UUID: "u", Rejoin: true}}, &fakeTickets{token: firstJoinToken}, &fakeJoiner{}
	if err := run(t, d, tk, j); err != nil {
		t.Fatal(err)
	}
	if j.calls != 1 || len(tk.reqs) != 2 || !tk.reqs[1].RequestToken {
		t.Fatalf("joins %d requests %+v", j.calls, tk.reqs)
	}
}

func TestDiskOnlyVerifierWithJoinerIsAnError(t *testing.T) {
	err := run(t, &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeTickets{}, &fakeJoiner{})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != StageTicket || !strings.Contains(err.Error(), "disk-only") {
		t.Fatalf("err = %v", err)
	}
}

func TestDiskOpenIsReportedBeforeJoin(t *testing.T) {
	var seen []Progress
	j := &orderJoiner{seen: &seen}
	b, _ := New(Config{NodeName: "n1", Disk: &fakeDisk{plan: disk.Plan{UUID: "u"}}, Tickets: &fakeTickets{token: firstJoinToken},
		Joiner: j, OnProgress: func(p Progress, _ string) { seen = append(seen, p) }})
	if err := b.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []Progress{PreparingDisk, Attesting, OpeningDisk, DiskOpen, Joining, Done}
	if len(seen) != len(want) || j.sawDiskOpen != true {
		t.Fatalf("progress %v, want %v; join saw DiskOpen first: %v", seen, want, j.sawDiskOpen)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("progress %v, want %v", seen, want)
		}
	}
}

// orderJoiner records whether DiskOpen was reported before it ran.
type orderJoiner struct {
	seen        *[]Progress
	sawDiskOpen bool
}

func (o *orderJoiner) Join(context.Context, *latchkeyv1.Ticket) error {
	for _, p := range *o.seen {
		o.sawDiskOpen = o.sawDiskOpen || p == DiskOpen
	}
	return nil
}

func TestStageErrorsNameTheStage(t *testing.T) {
	err := run(t, &fakeDisk{plan: disk.Plan{UUID: "u"}, openErr: errors.New("bad header")}, &fakeTickets{}, nil)
	var se *StageError
	if !errors.As(err, &se) || se.Stage != StageDisk {
		t.Fatalf("err = %v", err)
	}
	refused := &ticket.RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH}
	err = run(t, &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeTickets{err: refused}, nil)
	var re *ticket.RefusedError
	if !errors.As(err, &se) || se.Stage != StageTicket || !errors.As(err, &re) {
		t.Fatalf("err = %v", err)
	}
}

func TestJoinRetryFetchesTokenTicketAsRejoin(t *testing.T) {
	d, tk, j := &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeTickets{token: firstJoinToken}, &fakeJoiner{failures: 2}
	sl := &sleeps{}
	if err := run(t, d, tk, j, func(c *Config) { c.Sleep = sl.sleep }); err != nil {
		t.Fatal(err)
	}
	if len(tk.reqs) != 3 || !tk.reqs[1].Rejoin || !tk.reqs[1].RequestToken || !tk.reqs[2].RequestToken {
		t.Fatalf("requests %+v", tk.reqs)
	}
	// Each attempt ran with its own ticket, and the fresh tickets' disk
	// keys were cleared (the disk is open already).
	if j.calls != 3 || j.tickets[0] == j.tickets[1] || j.tickets[1] == j.tickets[2] {
		t.Fatalf("%d joins, tickets %p", j.calls, j.tickets)
	}
	for i, tk := range j.tickets[1:] {
		if strings.Trim(string(tk.DiskKey), "\x00") != "" {
			t.Fatalf("fresh ticket %d still carries its disk key", i+1)
		}
	}
	if len(sl.got) != 2 || sl.got[0] != DefaultJoinRetryDelay || sl.got[1] != DefaultJoinRetryDelay {
		t.Fatalf("waits %v, want two of %v", sl.got, DefaultJoinRetryDelay)
	}
}

func TestJoinGivesUpAfterAttempts(t *testing.T) {
	d, tk, j := &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeTickets{token: firstJoinToken}, &fakeJoiner{failures: 10}
	err := run(t, d, tk, j, func(c *Config) { c.JoinAttempts = 2 })
	var se *StageError
	want := "join stage: join: giving up after 2 attempts: kubeadm join failed (attempt 2)"
	if !errors.As(err, &se) || se.Stage != StageJoin || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if j.calls != 2 || len(tk.reqs) != 2 {
		t.Fatalf("%d joins, %d tickets", j.calls, len(tk.reqs))
	}
}

func TestJoinSingleAttemptReturnsItsError(t *testing.T) {
	d, tk, j := &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeTickets{token: firstJoinToken}, &fakeJoiner{failures: 1}
	sl := &sleeps{}
	err := run(t, d, tk, j, func(c *Config) { c.JoinAttempts = 1; c.Sleep = sl.sleep })
	if err == nil || err.Error() != "join stage: kubeadm join failed (attempt 1)" {
		t.Fatalf("err = %v", err)
	}
	if j.calls != 1 || len(tk.reqs) != 1 || len(sl.got) != 0 {
		t.Fatalf("%d joins, %d tickets, waits %v", j.calls, len(tk.reqs), sl.got)
	}
}

func TestJoinRetryStopsWhenTheWaitIsCancelled(t *testing.T) {
	d, tk, j := &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeTickets{token: firstJoinToken}, &fakeJoiner{failures: 10}
	sl := &sleeps{err: context.Canceled}
	err := run(t, d, tk, j, func(c *Config) { c.Sleep = sl.sleep })
	var se *StageError
	if !errors.As(err, &se) || se.Stage != StageJoin || !errors.Is(err, context.Canceled) ||
		!strings.Contains(err.Error(), "kubeadm join failed (attempt 1)") {
		t.Fatalf("err = %v", err)
	}
	if j.calls != 1 || len(tk.reqs) != 1 {
		t.Fatalf("%d joins, %d tickets after a cancelled wait", j.calls, len(tk.reqs))
	}
}

func TestJoinRetryStopsWhenNoFreshTicket(t *testing.T) {
	d, j := &fakeDisk{plan: disk.Plan{UUID: "u"}}, &fakeJoiner{failures: 10}
	refused := &ticket.RefusedError{Reason: latchkeyv1.Reason_PCR_MISMATCH}
	tk := &fakeTickets{token: firstJoinToken}
	b, err := New(Config{NodeName: "n1", Disk: d, Tickets: &failAfter{fakeTickets: tk, n: 1, err: refused}, Joiner: j,
		Logger: slog.New(slog.DiscardHandler), Sleep: (&sleeps{}).sleep})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Run(context.Background())
	var se *StageError
	var re *ticket.RefusedError
	if !errors.As(err, &se) || se.Stage != StageJoin || !errors.As(err, &re) ||
		!strings.HasPrefix(err.Error(), "join stage: join: fetch ticket: ") {
		t.Fatalf("err = %v", err)
	}
	if j.calls != 1 {
		t.Fatalf("%d joins", j.calls)
	}
}

// failAfter serves n tickets, then fails with err.
type failAfter struct {
	*fakeTickets
	n   int
	err error
}

func (f *failAfter) Get(ctx context.Context, r ticket.Request) (*latchkeyv1.Ticket, error) {
	if len(f.reqs) >= f.n {
		f.reqs = append(f.reqs, r)
		return nil, f.err
	}
	return f.fakeTickets.Get(ctx, r)
}

func TestNewRefusesNegativeJoinOptions(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.JoinAttempts = -1 },
		func(c *Config) { c.JoinRetryDelay = -time.Second },
	} {
		cfg := Config{Disk: &fakeDisk{}, Tickets: &fakeTickets{}}
		mod(&cfg)
		if _, err := New(cfg); err == nil || err.Error() != "boot: negative join attempts or retry delay" {
			t.Fatalf("New = %v", err)
		}
	}
}
