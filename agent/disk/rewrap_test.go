package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
)

// Rewrap tests run real cryptsetup and luks.go against real LUKS2
// headers on loop devices. A key of generation n stands in for the
// verifier's HKDF under secret n.
func genKey(n uint32) []byte { return testKey(byte(0x40 + n)) }

// ticketKeys are the keys a verifier serving current hands out for a
// Hello naming named (nil: a first boot).
func ticketKeys(current uint32, named *uint32) Keys {
	k := Keys{Current: genKey(current), Generation: current}
	if named != nil && *named != current {
		k.Previous, k.PreviousGeneration = genKey(*named), *named
	}
	return k
}

// bootKeys runs Prepare and Open like the agent does, with the keys a
// verifier on generation current would send for the plan.
func (r *testRig) bootKeys(l *LUKS, current uint32) (Plan, Result, error) {
	ctx := context.Background()
	plan, err := l.Prepare(ctx)
	if err != nil {
		return plan, Result{}, err
	}
	res, err := l.Open(ctx, plan, ticketKeys(current, plan.KeyGeneration))
	return plan, res, err
}

// storeData writes a file onto the open state disk and returns its
// content, for a check after every later boot.
func storeData(t *testing.T, r *testRig) []byte {
	t.Helper()
	data := randomBytes(64 << 10)
	if err := os.WriteFile(filepath.Join(r.root, "state", "data.bin"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sync").CombinedOutput(); err != nil {
		t.Fatalf("sync: %v %s", err, out)
	}
	return data
}

func checkData(t *testing.T, r *testRig, want []byte) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(r.root, "state", "data.bin"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("data written before the rewrap: %v (equal %v)", err, bytes.Equal(got, want))
	}
}

// cryptsetupOpens reports whether cryptsetup accepts key for the header
// on dev. It runs on a copy of the header area in a temporary file, so
// cryptsetup's own recovery of a header it finds inconsistent can never
// write to the device under test.
func cryptsetupOpens(t *testing.T, dev string, key []byte) bool {
	t.Helper()
	img := filepath.Join(t.TempDir(), "hdr.img")
	if err := os.WriteFile(img, readDev(t, dev, 0, luks2.DataOffset), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, luks2.DataOffset+mib); err != nil {
		t.Fatal(err)
	}
	_, err := realRunner.Run(context.Background(), execx.Cmd{Name: "cryptsetup",
		Args: []string{"open", "--test-passphrase", "--key-slot", "0", "--key-file", "-", img}, Stdin: bytes.NewReader(key),
		AnswerExitCodes: []int{2}})
	switch code := execx.ExitCode(err); {
	case err == nil:
		return true
	case code == 2: // "No key available with this passphrase."
		return false
	default:
		t.Fatalf("cryptsetup open --test-passphrase: %v", err)
	}
	return false
}

// opens checks that cryptsetup and luks.go (the agent's unseal, on the
// detached header) open the header on dev with generation yes's key and
// with none of no's.
func opens(t *testing.T, dev string, yes uint32, no ...uint32) {
	t.Helper()
	head := readDev(t, dev, 0, blankCheckLength)
	if !cryptsetupOpens(t, dev, genKey(yes)) {
		t.Fatalf("cryptsetup does not open the header with generation %d's key", yes)
	}
	if _, err := unsealDetached(head, genKey(yes), "", luks2.DataOffset+mib); err != nil {
		t.Fatalf("luks.go does not open the header with generation %d's key: %v", yes, err)
	}
	for _, o := range no {
		if cryptsetupOpens(t, dev, genKey(o)) {
			t.Fatalf("cryptsetup still opens the header with generation %d's key", o)
		}
		if _, err := unsealDetached(head, genKey(o), "", luks2.DataOffset+mib); err == nil {
			t.Fatalf("luks.go still opens the header with generation %d's key", o)
		}
	}
}

// header reads and validates the header on dev.
func diskHeader(t *testing.T, dev string) (*luks2.Header, []byte) {
	t.Helper()
	head := readDev(t, dev, 0, blankCheckLength)
	h, err := luks2.Validate(head, "")
	if err != nil {
		t.Fatalf("header on the disk: %v", err)
	}
	return h, head
}

// checkSettled: the header is an ordinary one of generation gen, keyslot
// 0 in area, the other area zeroed, and cryptsetup opens it with gen's
// key and not with any of old's.
func checkSettled(t *testing.T, dev string, gen uint32, area int64, old ...uint32) {
	t.Helper()
	h, head := diskHeader(t, dev)
	if h.Prior != nil || h.Generation != gen || h.Area != area {
		t.Fatalf("header: generation %d, area %d, transitional %v; want %d, %d, settled", h.Generation, h.Area, h.Prior != nil, gen, area)
	}
	if !allZero(head[luks2.OtherArea(area) : luks2.OtherArea(area)+luks2.KeyslotAreaSize]) {
		t.Fatal("the old keyslot area still holds key material")
	}
	opens(t, dev, gen, old...)
	if got := cString(head[luks2.OffSubsystem : luks2.OffSubsystem+48]); got != luks2.SubsystemName(gen) {
		t.Fatalf("subsystem %q, want %q", got, luks2.SubsystemName(gen))
	}
}

// A disk made under generation 0 is rewrapped to 1 at its next boot and
// to 2 at the one after, alternating areas; the data stays; cryptsetup
// then opens it with the current key only; the seqid grows by one per
// rewrap and the KDF salt changes.
func TestRewrapAcrossGenerations(t *testing.T) {
	r := newRig(t, testDiskSize)
	_, res := r.mustBoot(r.stage(nil), genKey(0))
	if resultGeneration(res) != 0 {
		t.Fatalf("first boot under generation 0: result generation %d", resultGeneration(res))
	}
	data := storeData(t, r)
	checkSettled(t, r.dev, 0, luks2.AreaA)
	h0, _ := diskHeader(t, r.dev)
	r.kernel.powerOff()
	for i, want := range []struct {
		gen  uint32
		area int64
	}{{1, luks2.AreaB}, {2, luks2.AreaA}} {
		plan, res, err := r.bootKeys(r.stage(nil), want.gen)
		if err != nil {
			t.Fatalf("boot under generation %d: %v", want.gen, err)
		}
		if plan.KeyGeneration == nil || *plan.KeyGeneration != want.gen-1 || resultGeneration(res) != int64(want.gen) || res.Formatted || res.MadeFileSystem {
			t.Fatalf("boot under generation %d: plan %+v, result %+v", want.gen, plan, res)
		}
		checkData(t, r, data)
		r.kernel.powerOff()
		checkSettled(t, r.dev, want.gen, want.area, want.gen-1)
		h, _ := diskHeader(t, r.dev)
		if h.SeqID != h0.SeqID+uint64(i+1) {
			t.Fatalf("seqid %d after %d rewraps of %d", h.SeqID, i+1, h0.SeqID)
		}
		sp, _ := luks2.SlotParamsOf(h.JSON)
		sp0, _ := luks2.SlotParamsOf(h0.JSON)
		if bytes.Equal(sp.KDFSalt, sp0.KDFSalt) || !bytes.Equal(sp.Digest, sp0.Digest) {
			t.Fatal("rewrap kept the KDF salt or changed the digest")
		}
		if !bytes.Contains(r.logs.Bytes(), []byte(`"msg":"state disk: keyslot rewrapped"`)) ||
			bytes.Contains(r.logs.Bytes(), genKey(want.gen)) {
			t.Fatalf("log: want the rewrap line and no key:\n%s", r.logs)
		}
	}
	// An ordinary reboot on the current generation writes nothing to
	// the header area (the mount itself updates the file system).
	headBefore := readDev(t, r.dev, 0, luks2.DataOffset)
	if _, _, err := r.bootKeys(r.stage(nil), 2); err != nil {
		t.Fatal(err)
	}
	r.kernel.powerOff()
	if !bytes.Equal(readDev(t, r.dev, 0, luks2.DataOffset), headBefore) {
		t.Fatal("a boot on the current generation changed the header area")
	}
	before := checksum(t, r.dev)
	// The ticket's keys must open the header: a verifier that has lost
	// generation 2's secret (another key under the same number) is
	// refused before anything is written.
	wrong := Keys{Current: genKey(9), Generation: 3, Previous: genKey(8), PreviousGeneration: 2}
	if _, err := r.stage(nil).Open(context.Background(), Plan{UUID: h0.UUID, Rejoin: true}, wrong); err == nil ||
		!bytes.Contains([]byte(err.Error()), []byte("the header is keyed under master-secret generation [2] and the ticket's keys (generation 3 and 2) do not open it")) {
		t.Fatalf("wrong keys: %v", err)
	}
	if checksum(t, r.dev) != before {
		t.Fatal("a refused rewrap changed the disk")
	}
}

// A first boot writes the ticket's generation into the new header.
func TestFirstBootWritesCurrentGeneration(t *testing.T) {
	r := newRig(t, testDiskSize)
	plan, res, err := r.bootKeys(r.stage(nil), 5)
	if err != nil {
		t.Fatal(err)
	}
	if plan.KeyGeneration != nil || resultGeneration(res) != 5 || !res.Formatted {
		t.Fatalf("plan %+v, result %+v", plan, res)
	}
	r.kernel.powerOff()
	checkSettled(t, r.dev, 5, luks2.AreaA, 0)
	plan, err = r.stage(nil).Prepare(context.Background())
	if err != nil || plan.KeyGeneration == nil || *plan.KeyGeneration != 5 {
		t.Fatalf("Prepare after the first boot: %+v %v", plan, err)
	}
}

const (
	rewrapEnvDevice = "LATCHKEY_DISK_REWRAP_DEVICE"
	rewrapEnvStep   = "LATCHKEY_DISK_REWRAP_STEP"
	rewrapEnvGen    = "LATCHKEY_DISK_REWRAP_GENERATION"
)

var rewrapSteps = []Step{StepRewrapKeyslotWritten, StepRewrapPrimaryWritten, StepRewrapSecondaryWritten, StepRewrapOldAreaZeroed}

// TestRewrapChildProcess is an agent booting under a newer generation,
// killed (SIGKILL, by itself: no deferred code, no chance to tidy up)
// right after the write and fsync of one rewrap step. It does nothing
// unless run by TestRewrapKilledAtEveryStep.
func TestRewrapChildProcess(t *testing.T) {
	dev := os.Getenv(rewrapEnvDevice)
	if dev == "" {
		t.Skip("helper process for TestRewrapKilledAtEveryStep")
	}
	step := Step(os.Getenv(rewrapEnvStep))
	gen, _ := strconv.ParseUint(os.Getenv(rewrapEnvGen), 10, 32)
	l, err := NewLUKS(LUKSConfig{Device: dev, Kernel: stopKernel{}, Logger: slog.New(slog.DiscardHandler),
		MountPoint: "/nonexistent/latchkey-rewrap", BindMounts: []string{},
		FaultHook: func(s Step) error {
			if s == step {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // never returns
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := l.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Open(context.Background(), plan, ticketKeys(uint32(gen), plan.KeyGeneration))
	fmt.Printf("REWRAP-CHILD-ENDED %v\n", err) // reached only if the kill did not happen
}

// killedRewrap runs one agent process that rewraps dev to gen and is
// killed after step.
func killedRewrap(t *testing.T, dev string, step Step, gen uint32) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRewrapChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), rewrapEnvDevice+"="+dev, rewrapEnvStep+"="+string(step), rewrapEnvGen+"="+strconv.Itoa(int(gen)))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the agent was not killed at %s: %v\n%s", step, err, out)
	}
}

// TestRewrapKilledAtEveryStep kills a real agent process after each
// write and fsync of the rewrap (steps 2 to 5 of the design), then boots
// again (power cycle: mappings and mounts gone). Every time the next boot
// opens the disk, the data written before is intact, the disk ends on the
// current generation with the old area zeroed, and cryptsetup opens the
// result with the current key only. In between, the state the kill left
// is checked: what cryptsetup reads, which generation the next Hello
// names, and that the transitional state is the validator's one
// exception.
func TestRewrapKilledAtEveryStep(t *testing.T) {
	requireRoot(t)
	for _, step := range rewrapSteps {
		t.Run(string(step), func(t *testing.T) {
			r := newRig(t, testDiskSize)
			r.mustBoot(r.stage(nil), genKey(0))
			data := storeData(t, r)
			r.kernel.powerOff()
			before, _ := diskHeader(t, r.dev)

			killedRewrap(t, r.dev, step, 1)

			h, head := diskHeader(t, r.dev)
			plan, err := r.stage(nil).Prepare(context.Background())
			if err != nil {
				t.Fatalf("Prepare after the kill: %v", err)
			}
			switch step {
			case StepRewrapKeyslotWritten: // the old header; the new keyslot sits unreferenced in area B
				if h.SeqID != before.SeqID || h.Generation != 0 || h.Prior != nil || allZero(head[luks2.AreaB:luks2.AreaB+luks2.KeyslotAreaSize]) {
					t.Fatalf("header after %s: %+v", step, h)
				}
				opens(t, r.dev, 0, 1) // the old key opens the old header, the new one not
			case StepRewrapPrimaryWritten: // the transitional state
				if h.Prior == nil || h.Generation != 1 || h.Prior.Generation != 0 || h.SeqID != before.SeqID+1 || h.Area != luks2.AreaB || h.Prior.Area != luks2.AreaA {
					t.Fatalf("header after %s: %+v, want the transitional state", step, h)
				}
			case StepRewrapSecondaryWritten: // the new header; the old keyslot still in area A
				if h.Prior != nil || h.Generation != 1 || allZero(head[luks2.AreaA:luks2.AreaA+luks2.KeyslotAreaSize]) {
					t.Fatalf("header after %s: %+v", step, h)
				}
				opens(t, r.dev, 1, 0) // the new key opens the new header, the old one not
			case StepRewrapOldAreaZeroed:
				checkSettled(t, r.dev, 1, luks2.AreaB, 0)
			}
			wantNamed := uint32(0)
			if step == StepRewrapSecondaryWritten || step == StepRewrapOldAreaZeroed {
				wantNamed = 1
			}
			if plan.KeyGeneration == nil || *plan.KeyGeneration != wantNamed {
				t.Fatalf("after %s the Hello names generation %v, want %d", step, plan.KeyGeneration, wantNamed)
			}

			_, res, err := r.bootKeys(r.stage(nil), 1)
			if err != nil {
				t.Fatalf("boot after the kill at %s: %v", step, err)
			}
			if resultGeneration(res) != 1 || res.Formatted || res.MadeFileSystem {
				t.Fatalf("result %+v", res)
			}
			checkData(t, r, data)
			r.kernel.powerOff()
			checkSettled(t, r.dev, 1, luks2.AreaB, 0)
		})
	}
}

// A transitional header left under generation 1 while the verifier has
// moved on to 2: the Hello names the older copy's generation (0), the
// ticket carries keys 2 and 0, and the boot rewraps from the copy key 0
// opens, ending on 2.
func TestRewrapFromTransitionalToANewerGeneration(t *testing.T) {
	requireRoot(t)
	r := newRig(t, testDiskSize)
	r.mustBoot(r.stage(nil), genKey(0))
	data := storeData(t, r)
	r.kernel.powerOff()
	killedRewrap(t, r.dev, StepRewrapPrimaryWritten, 1)
	_, res, err := r.bootKeys(r.stage(nil), 2)
	if err != nil || resultGeneration(res) != 2 {
		t.Fatalf("boot under generation 2: %+v %v", res, err)
	}
	checkData(t, r, data)
	r.kernel.powerOff()
	// Rewrapped from the secondary copy (area A) into area B.
	checkSettled(t, r.dev, 2, luks2.AreaB, 0, 1)
}

// An agent from before generations, booting after the rotation,
// formatted its disk with the current key but wrote no subsystem
// (generation 0). A current agent names generation 0, finds that key 0
// does not open it and the current key does, and rewraps it so the header
// names the generation it is really under.
func TestRewrapHeaderThatNamesTheWrongGeneration(t *testing.T) {
	r := newRig(t, testDiskSize)
	r.mustBoot(r.stage(nil), genKey(1)) // Open(key): generation 0 in the header
	data := storeData(t, r)
	r.kernel.powerOff()
	if h, _ := diskHeader(t, r.dev); h.Generation != 0 {
		t.Fatalf("the old agent's header names generation %d", h.Generation)
	}
	plan, res, err := r.bootKeys(r.stage(nil), 1)
	if err != nil || *plan.KeyGeneration != 0 || resultGeneration(res) != 1 {
		t.Fatalf("boot: plan %+v, result %+v, %v", plan, res, err)
	}
	checkData(t, r, data)
	r.kernel.powerOff()
	checkSettled(t, r.dev, 1, luks2.AreaB, 0)
}

// A rewrap killed after its primary write, and the boot that finishes it
// killed too, after each of the finishing writes: the boot after that
// still ends on the current generation with the data intact.
func TestRewrapFinishKilled(t *testing.T) {
	requireRoot(t)
	for _, step := range []Step{StepRewrapSecondaryWritten, StepRewrapOldAreaZeroed} {
		t.Run(string(step), func(t *testing.T) {
			r := newRig(t, testDiskSize)
			r.mustBoot(r.stage(nil), genKey(0))
			data := storeData(t, r)
			r.kernel.powerOff()
			killedRewrap(t, r.dev, StepRewrapPrimaryWritten, 1)
			killedRewrap(t, r.dev, step, 1)
			if h, _ := diskHeader(t, r.dev); h.Prior != nil || h.Generation != 1 {
				t.Fatalf("after the finishing boot was killed at %s: generation %d, transitional %v", step, h.Generation, h.Prior != nil)
			}
			_, res, err := r.bootKeys(r.stage(nil), 1)
			if err != nil || resultGeneration(res) != 1 {
				t.Fatalf("boot: %+v %v", res, err)
			}
			checkData(t, r, data)
			r.kernel.powerOff()
			checkSettled(t, r.dev, 1, luks2.AreaB, 0)
		})
	}
}

// resultGeneration is the generation Open reports, -1 when it reports
// none (the LUKS stage always reports one).
func resultGeneration(r Result) int64 {
	if r.KeyGeneration == nil {
		return -1
	}
	return int64(*r.KeyGeneration)
}
