package boot

import (
	"context"
	"errors"
	"strings"
	"testing"

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
func (d *fakeDisk) Open(_ context.Context, _ disk.Plan, key []byte) (disk.Result, error) {
	d.keySeen = append([]byte{}, key...)
	d.keyPassed = key
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
	failures int
}

// Join fails the first failures times, fetching a fresh ticket each time.
func (j *fakeJoiner) Join(ctx context.Context, t *latchkeyv1.Ticket, fetch func(context.Context) (*latchkeyv1.Ticket, error)) error {
	j.calls++
	for i := 0; i < j.failures; i++ {
		var err error
		if t, err = fetch(ctx); err != nil {
			return err
		}
	}
	if t.GetToken() == "" {
		return errors.New("no token")
	}
	return nil
}

func firstJoinToken(r ticket.Request) string {
	if !r.Rejoin || r.RequestToken {
		return "abcdef.0123456789abcdef"
	}
	return ""
}

func run(t *testing.T, d *fakeDisk, tk *fakeTickets, j Joiner) error {
	t.Helper()
	b, err := New(Config{NodeName: "n1", Role: latchkeyv1.Role_ROLE_WORKER, Disk: d, Tickets: tk, Joiner: j})
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

func (o *orderJoiner) Join(context.Context, *latchkeyv1.Ticket, func(context.Context) (*latchkeyv1.Ticket, error)) error {
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
	if err := run(t, d, tk, j); err != nil {
		t.Fatal(err)
	}
	if len(tk.reqs) != 3 || !tk.reqs[1].Rejoin || !tk.reqs[1].RequestToken || !tk.reqs[2].RequestToken {
		t.Fatalf("requests %+v", tk.reqs)
	}
}
