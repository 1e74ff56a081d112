package boot

import (
	"bytes"
	"context"
	"testing"

	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/ticket"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// keyedDisk is a disk stage that can rewrap: it records the keys it got.
type keyedDisk struct {
	fakeDisk
	keys     disk.Keys
	prevSeen []byte
}

func (d *keyedDisk) Open(_ context.Context, _ disk.Plan, k disk.Keys) (disk.Result, error) {
	d.keys = k
	d.prevSeen = bytes.Clone(k.Previous)
	return disk.Result{KeyGeneration: &k.Generation}, nil
}

// generationTickets answers like a verifier on generation 3.
type generationTickets struct{ reqs []ticket.Request }

func (f *generationTickets) Get(_ context.Context, r ticket.Request) (*latchkeyv1.Ticket, error) {
	f.reqs = append(f.reqs, r)
	t := &latchkeyv1.Ticket{DiskKey: bytes.Repeat([]byte{3}, 32), KeyGeneration: 3}
	if r.DiskKeyGeneration != nil && *r.DiskKeyGeneration != 3 {
		t.PreviousDiskKey, t.PreviousKeyGeneration = bytes.Repeat([]byte{1}, 32), *r.DiskKeyGeneration
	}
	if r.RequestToken {
		t.Token = "abcdef.0123456789abcdef"
	}
	return t, nil
}

// The Hello names the header's generation; the disk stage gets both keys
// (the previous one cleared afterwards); a later ticket in the same boot
// names the generation the disk is on now.
func TestRewrapKeysReachTheDiskStage(t *testing.T) {
	one := uint32(1)
	d := &keyedDisk{fakeDisk: fakeDisk{plan: disk.Plan{UUID: "u", Rejoin: true, KeyGeneration: &one}}}
	tk := &generationTickets{}
	var plans []disk.Plan
	b, err := New(Config{NodeName: "n1", Role: latchkeyv1.Role_ROLE_WORKER, Disk: d, Tickets: tk, Joiner: &fakeJoiner{},
		OnPlan: func(p disk.Plan) { plans = append(plans, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(tk.reqs) != 2 || *tk.reqs[0].DiskKeyGeneration != 1 || tk.reqs[1].DiskKeyGeneration == nil || *tk.reqs[1].DiskKeyGeneration != 3 {
		t.Fatalf("requests %+v: want generation 1, then 3 once the disk is rewrapped", tk.reqs)
	}
	// OnPlan hears the generation found, then the one the disk is on now
	// (what re-attestation reports).
	if len(plans) != 2 || *plans[0].KeyGeneration != 1 || *plans[1].KeyGeneration != 3 {
		t.Fatalf("plans %+v", plans)
	}
	if d.keys.Generation != 3 || d.keys.PreviousGeneration != 1 || !bytes.Equal(d.prevSeen, bytes.Repeat([]byte{1}, 32)) {
		t.Fatalf("keys %+v", d.keys)
	}
	if !bytes.Equal(d.keys.Previous, make([]byte, 32)) || !bytes.Equal(d.keys.Current, make([]byte, 32)) {
		t.Fatal("the keys were not cleared after the disk stage")
	}
}

// A stage that keys no header (KeyOnly) reports no generation: OnPlan
// hears the plan once and the later ticket of the same boot names none,
// as the first did.
func TestStageWithoutGenerationKeepsThePlan(t *testing.T) {
	d := &fakeDisk{plan: disk.Plan{UUID: "u", Rejoin: true}}
	tk := &generationTickets{}
	var plans []disk.Plan
	b, err := New(Config{NodeName: "n1", Role: latchkeyv1.Role_ROLE_WORKER, Disk: d, Tickets: tk, Joiner: &fakeJoiner{},
		OnPlan: func(p disk.Plan) { plans = append(plans, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(plans) != 1 || plans[0].KeyGeneration != nil {
		t.Fatalf("plans %+v: want one, naming no generation", plans)
	}
	if len(tk.reqs) != 2 || tk.reqs[0].DiskKeyGeneration != nil || tk.reqs[1].DiskKeyGeneration != nil {
		t.Fatalf("requests %+v: want two naming no generation", tk.reqs)
	}
}
