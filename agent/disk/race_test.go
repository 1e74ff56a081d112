package disk

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/anatol/luks.go"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/execx/execxtest"
)

// Two agents started together on one blank disk. Each is a real process
// (this test binary run again as TestRaceChildProcess) running the real
// disk stage: Prepare, then, once both have prepared (so both saw a
// blank disk and planned their own UUID), Open with the key a verifier
// would derive for its UUID. Exactly one may format; the other must find
// the first one's committed header and stop, and that header must be the
// one on the disk at the end.

const raceEnv = "LATCHKEY_DISK_RACE_DEVICE"

// raceKey stands in for the verifier's HKDF: one key per disk UUID.
func raceKey(uuid string) []byte {
	k := sha256.Sum256([]byte("latchkey race test " + uuid))
	return k[:]
}

type raceReport struct {
	UUID        string `json:"uuid"`
	LuksFormats int    `json:"luks_formats"`
	Err         string `json:"err"`
	StateChange bool   `json:"state_changed"`
}

// stopKernel ends Open right after the header, which is all the race is
// about (and needs no mapping).
type stopKernel struct{}

var errRaceStop = errors.New("race child: stop after the header")

func (stopKernel) MapCrypt(context.Context, string, *luks.Volume) (string, error) {
	return "", errRaceStop
}
func (stopKernel) Mount(context.Context, string, string, string) error { return errRaceStop }
func (stopKernel) Bind(context.Context, string, string) error          { return errRaceStop }

// TestRaceChildProcess is one racing agent; it does nothing unless run
// by TestTwoAgentsRaceForOneDisk.
func TestRaceChildProcess(t *testing.T) {
	dev := os.Getenv(raceEnv)
	if dev == "" {
		t.Skip("helper process for TestTwoAgentsRaceForOneDisk")
	}
	rec := &execxtest.Fake{Next: execx.New(execx.Config{Logger: slog.New(slog.DiscardHandler)})}
	l, err := NewLUKS(LUKSConfig{Device: dev, Runner: rec, Kernel: stopKernel{}, Logger: slog.New(slog.DiscardHandler),
		MountPoint: "/nonexistent/latchkey-race", BindMounts: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	plan, err := l.Prepare(ctx)
	if err != nil {
		fmt.Printf("RACE-PREPARE-FAILED %v\n", err)
		return
	}
	fmt.Println("RACE-PREPARED")
	io.ReadAll(os.Stdin) // the parent closes stdin when both have prepared
	_, err = l.Open(ctx, plan, Keys{Current: raceKey(plan.UUID)})
	r := raceReport{UUID: plan.UUID, LuksFormats: rec.Ran("cryptsetup luksFormat"), StateChange: errors.Is(err, ErrStateChanged)}
	if err != nil {
		r.Err = err.Error()
	}
	b, _ := json.Marshal(r)
	fmt.Printf("RACE-REPORT %s\n", b)
}

type raceChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startRaceChild(t *testing.T, dev string) *raceChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRaceChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), raceEnv+"="+dev)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &raceChild{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
}

// line returns the next line with prefix (skipping go test's own).
func (c *raceChild) line(t *testing.T, prefix string) string {
	t.Helper()
	for c.out.Scan() {
		if rest, ok := strings.CutPrefix(c.out.Text(), prefix); ok {
			return strings.TrimSpace(rest)
		}
		if strings.HasPrefix(c.out.Text(), "RACE-PREPARE-FAILED") {
			t.Fatalf("child: %s", c.out.Text())
		}
	}
	t.Fatalf("child ended without %q", prefix)
	return ""
}

func TestTwoAgentsRaceForOneDisk(t *testing.T) {
	requireRoot(t)
	const trials = 50
	dev := newLoop(t, testDiskSize)
	for trial := range trials {
		writeDev(t, dev, 0, make([]byte, luks2.DataOffset)) // blank again
		a, b := startRaceChild(t, dev), startRaceChild(t, dev)
		a.line(t, "RACE-PREPARED")
		b.line(t, "RACE-PREPARED")
		a.stdin.Close() // both go at once
		b.stdin.Close()
		var reps [2]raceReport
		for i, c := range []*raceChild{a, b} {
			if err := json.Unmarshal([]byte(c.line(t, "RACE-REPORT")), &reps[i]); err != nil {
				t.Fatal(err)
			}
			c.cmd.Wait()
		}
		var winner, loser *raceReport
		for i := range reps {
			if reps[i].LuksFormats > 0 {
				if winner != nil {
					t.Fatalf("trial %d: both agents formatted: %+v", trial, reps)
				}
				winner = &reps[i]
			} else {
				loser = &reps[i]
			}
		}
		if winner == nil || loser == nil {
			t.Fatalf("trial %d: want exactly one format: %+v", trial, reps)
		}
		if !strings.Contains(winner.Err, errRaceStop.Error()) {
			t.Fatalf("trial %d: the winner did not get past its header: %s", trial, winner.Err)
		}
		if !loser.StateChange || !strings.Contains(loser.Err, winner.UUID) || !strings.Contains(loser.Err, "not rewriting it") {
			t.Fatalf("trial %d: the loser: %s; want ErrStateChanged naming %s", trial, loser.Err, winner.UUID)
		}
		// The winner's header is the one on the disk, and its key opens it.
		head := readDev(t, dev, 0, blankCheckLength)
		if _, err := luks2.Validate(head, winner.UUID); err != nil {
			t.Fatalf("trial %d: the disk does not carry the winner's header: %v", trial, err)
		}
		if _, err := unsealDetached(head, raceKey(winner.UUID), "", testDiskSize); err != nil {
			t.Fatalf("trial %d: the winner's key does not open the disk: %v", trial, err)
		}
	}
}
