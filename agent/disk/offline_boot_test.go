package disk_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/latchkey/latchkey/agent/app"
	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/execx"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// verifier stands in for the verifiers: a ticket with the disk key and a
// grant signed by a test Authorizer over this boot's PCR 11 and TPM
// clock, or no answer at all (down).
type verifier struct {
	t    *testing.T
	sim  *tpmtest.Simulator
	auth *offline.Authorizer
	key  []byte
	down bool
	// withdraw: the ticket withdraws the grant instead of carrying one.
	withdraw bool
	gets     int
}

func (v *verifier) ticket() (*latchkeyv1.Ticket, error) {
	v.gets++
	if v.down {
		return nil, errors.New("gave up: " + ticket.ErrUnreachable.Error())
	}
	if v.withdraw {
		return &latchkeyv1.Ticket{DiskKey: bytes.Clone(v.key), WithdrawOffline: true}, nil
	}
	return &latchkeyv1.Ticket{DiskKey: bytes.Clone(v.key), OfflineGrant: v.grant()}, nil
}

func (v *verifier) Get(context.Context, ticket.Request) (*latchkeyv1.Ticket, error) {
	return v.ticket()
}

func (v *verifier) GetWithin(_ context.Context, _ ticket.Request, _ time.Duration) (*latchkeyv1.Ticket, error) {
	if v.down {
		return nil, errors.Join(ticket.ErrUnreachable, errors.New("dial: connection refused"))
	}
	return v.ticket()
}

// grant is what a verifier reads from a verified quote of this boot.
func (v *verifier) grant() *latchkeyv1.OfflineGrant {
	tp, err := tpm.OpenDevice(v.sim.Device)
	if err != nil {
		v.t.Fatal(err)
	}
	defer tp.Close()
	pcr, err := tpm2.PCRRead{PCRSelectionIn: tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{
		{Hash: tpm2.TPMAlgSHA256, PCRSelect: tpm2.PCClientCompatible.PCRs(11)}}}}.Execute(tp)
	if err != nil {
		v.t.Fatal(err)
	}
	clock, err := tpm2.ReadClock{}.Execute(tp)
	if err != nil {
		v.t.Fatal(err)
	}
	g, err := v.auth.Grant(offline.GrantRequest{PolicyRef: offline.PolicyRef([]byte("ek"), "disk"),
		PCRs:       map[uint32][]byte{11: pcr.PCRValues.Digests[0].Buffer},
		ResetCount: clock.CurrentTime.ClockInfo.ResetCount, ClockMS: clock.CurrentTime.ClockInfo.Clock, MaxBoots: 2, MaxHours: 24})
	if err != nil {
		v.t.Fatal(err)
	}
	return g
}

type offlineMachine struct {
	t        *testing.T
	sim      *tpmtest.Simulator
	verifier *verifier
	dev      string
	kernel   disk.Kernel
	powerOff func()
	root     string
	logs     bytes.Buffer
	lines    []string
}

func (m *offlineMachine) stage() *disk.LUKS {
	l, err := disk.NewLUKS(disk.LUKSConfig{Device: m.dev, MountPoint: filepath.Join(m.root, "state"), Kernel: m.kernel,
		Runner: execx.New(execx.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}),
		Logger: slog.New(slog.NewTextHandler(&m.logs, nil))})
	if err != nil {
		m.t.Fatal(err)
	}
	return l
}

// run boots once, as the agent does: the real LUKS stage on the loop
// device, the real TPM sealer on the swtpm.
func (m *offlineMachine) run() (*boot.Boot, error) {
	l := m.stage()
	m.lines = nil
	b, err := boot.New(boot.Config{NodeName: "n1", Disk: l, Tickets: m.verifier,
		Logger:     slog.New(slog.NewTextHandler(&m.logs, nil)),
		OnProgress: func(_ boot.Progress, line string) { m.lines = append(m.lines, line) },
		Offline:    &boot.Offline{Sealer: app.NewTPMSealer(m.sim.Device), Store: l, After: time.Second}})
	if err != nil {
		m.t.Fatal(err)
	}
	return b, b.Run(context.Background())
}

// reboot: the disk unmounted, the TPM power-cycled, and the boot chain
// measured again (uki names what PCR 11 gets).
func (m *offlineMachine) reboot(uki string) {
	m.powerOff()
	m.sim.Restart(m.t)
	m.sim.Extend(m.t, 11, []byte(uki))
}

func newOfflineMachine(t *testing.T) *offlineMachine {
	t.Helper()
	tpmtest.CheckTools(t)
	gk, err := offline.DeriveGrantKey(bytes.Repeat([]byte{9}, 32))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := offline.NewAuthorizer(gk)
	if err != nil {
		t.Fatal(err)
	}
	sim := tpmtest.Start(t)
	sim.Extend(t, 11, []byte("genuine uki"))
	m := &offlineMachine{t: t, sim: sim, dev: disk.NewLoopForTest(t, disk.TestDiskSize), root: t.TempDir(),
		verifier: &verifier{t: t, sim: sim, auth: auth, key: bytes.Repeat([]byte{0x33}, 32)}}
	m.kernel, m.powerOff = disk.NewLoopKernelForTest(t)
	return m
}

// header reads or writes both header copies (32 KiB) of the loop device.
func (m *offlineMachine) header(write []byte) []byte {
	f, err := os.OpenFile(m.dev, os.O_RDWR, 0)
	if err != nil {
		m.t.Fatal(err)
	}
	defer f.Close()
	if write != nil {
		if _, err := f.WriteAt(write, 0); err != nil {
			m.t.Fatal(err)
		}
		return write
	}
	b := make([]byte, 32<<10)
	if _, err := f.ReadAt(b, 0); err != nil {
		m.t.Fatal(err)
	}
	return b
}

// A verifier's withdrawal erases the token and moves the TPM's grant
// counter: a copy of the old header, token and all, put back by someone
// who kept it, passes the header validator but the TPM refuses it.
func TestOfflineWithdrawKillsCopiedToken(t *testing.T) {
	m := newOfflineMachine(t)
	if _, err := m.run(); err != nil {
		t.Fatalf("first boot: %v", err)
	}
	copied := m.header(nil)
	m.reboot("genuine uki")
	m.verifier.withdraw = true
	b, err := m.run()
	if err != nil {
		t.Fatalf("boot with a withdrawal: %v", err)
	}
	if h := b.OfflineHello(); h == nil || !h.Withdrawn || h.Held {
		t.Fatalf("Hello.offline after the withdrawal: %v", h)
	}
	if plan, err := m.stage().Prepare(context.Background()); err != nil || plan.Offline != nil {
		t.Fatalf("after the withdrawal: %v, token %v", err, plan.Offline)
	}
	m.reboot("genuine uki")
	m.header(copied)
	m.verifier.down = true
	m.logs.Reset()
	if _, err := m.run(); err == nil || !strings.Contains(m.logs.String(), offline.ErrWithdrawn.Error()) {
		t.Fatalf("the copied token: %v\n%s", err, m.logs.String())
	}
}

// First boot attested with a grant; the next boot, with no verifier,
// unlocks offline with the TPM's key and finds the data; a boot with
// another UKI does not unlock; and the grant's boots run out, named.
func TestOfflineUnlockOnLoopDeviceAndSwtpm(t *testing.T) {
	m := newOfflineMachine(t)
	if _, err := m.run(); err != nil {
		t.Fatalf("first boot: %v", err)
	}
	data := filepath.Join(m.root, "state", "proof")
	if err := os.WriteFile(data, []byte("written online"), 0o600); err != nil {
		t.Fatal(err)
	}
	if plan, err := m.stage().Prepare(context.Background()); err != nil || plan.Offline == nil {
		t.Fatalf("after the first boot: %v, token %v", err, plan.Offline)
	}

	m.reboot("genuine uki")
	m.verifier.down = true
	gets := m.verifier.gets
	b, err := m.run()
	if err != nil {
		t.Fatalf("offline boot: %v\n%s", err, m.logs.String())
	}
	last := m.lines[len(m.lines)-1]
	if !strings.HasPrefix(last, "unlocked offline (boot 1 of 2, ") || !b.BootedOffline() || m.verifier.gets != gets {
		t.Fatalf("status %q, booted offline %v: want an offline unlock without a ticket", last, b.BootedOffline())
	}
	if got, err := os.ReadFile(data); err != nil || string(got) != "written online" {
		t.Fatalf("the data after the offline unlock: %q, %v", got, err)
	}

	// Another UKI: PCR 11 differs, the TPM refuses, the boot falls back to
	// the (unreachable) verifiers and fails like today.
	m.reboot("another uki")
	if _, err := m.run(); err == nil || !strings.Contains(m.logs.String(), "offline unlock refused by the TPM") ||
		!strings.Contains(m.logs.String(), offline.ErrPCRMismatch.Error()) {
		t.Fatalf("another UKI: %v\n%s", err, m.logs.String())
	}

	// That boot counted (resetCount moved): the next one is the third
	// since the grant, past its bound of 2, and says so.
	m.reboot("genuine uki")
	m.logs.Reset()
	if _, err := m.run(); err == nil || !strings.Contains(m.logs.String(), offline.ErrBootsSpent.Error()) {
		t.Fatalf("third boot: %v\n%s", err, m.logs.String())
	}
}
