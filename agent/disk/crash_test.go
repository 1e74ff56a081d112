package disk

import (
	"bytes"
	"context"
	"errors"
	"github.com/latchkey/latchkey/agent/disk/luks2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var errKilled = errors.New("killed by the test")

var allSteps = []Step{
	StepFormatted, StepHeaderPartial, StepHeaderWritten, StepMapped, StepMkfsStarted,
	StepFileSystemMade, StepFileSystemReady, StepMounted, StepBound,
}

// TestCrashAtEveryStep kills the first boot at each step, then boots
// again, either after a power cycle (mounts and mappings gone) or as an
// agent restart within the same boot (they stay). The second boot must
// end with the disk open, never reformat a complete header, and keep what
// was stored before the crash.
func TestCrashAtEveryStep(t *testing.T) {
	requireRoot(t)
	for _, step := range allSteps {
		for _, powerCycle := range []bool{true, false} {
			name := string(step) + "/restart"
			if powerCycle {
				name = string(step) + "/power-cycle"
			}
			t.Run(name, func(t *testing.T) { crashAndRecover(t, step, powerCycle) })
		}
	}
}

func crashAndRecover(t *testing.T, step Step, powerCycle bool) {
	r := newRig(t, testDiskSize)
	key := testKey(21)
	plan1, header := crashFirstBoot(t, r, key, step)
	if powerCycle {
		r.kernel.powerOff()
	}
	plan2, res, err := r.boot(r.stage(nil), key)
	if err != nil {
		t.Fatalf("boot after the crash: %v", err)
	}
	switch {
	case step == StepFormatted: // the device was never touched
		if plan2.Rejoin || !res.Formatted {
			t.Fatalf("plan %+v, result %+v: want a fresh first boot", plan2, res)
		}
	case step == StepHeaderPartial: // our own interrupted install, redone
		if plan2.UUID != plan1.UUID || plan2.Rejoin || !res.Formatted {
			t.Fatalf("plan %+v, result %+v: want the install redone for %s", plan2, res, plan1.UUID)
		}
	default: // the header was complete: never rewritten
		if plan2.UUID != plan1.UUID || !plan2.Rejoin || res.Formatted || r.rec.Ran("cryptsetup") != 0 {
			t.Fatalf("plan %+v, result %+v: want a rejoin without luksFormat", plan2, res)
		}
		if !bytes.Equal(readDev(t, r.dev, 0, luks2.RecordOffset), header) {
			t.Fatal("a complete header was rewritten")
		}
	}
	wantMkfs := !stepAtOrAfter(step, StepFileSystemReady)
	if res.MadeFileSystem != wantMkfs || (r.rec.Ran("mkfs") != 0) != wantMkfs {
		t.Fatalf("made file system = %v (mkfs ran %d times), want %v", res.MadeFileSystem, r.rec.Ran("mkfs"), wantMkfs)
	}
	if step == StepBound && !res.HasKubeletCredentials {
		t.Fatal("the file written before the crash is gone")
	}
	checkKeyBehaviour(t, r.dev, key)
}

// crashFirstBoot runs a first boot killed at step and returns its plan
// and the header and keyslots area it left.
func crashFirstBoot(t *testing.T, r *testRig, key []byte, step Step) (Plan, []byte) {
	t.Helper()
	hit := false
	first := r.stage(func(c *LUKSConfig) {
		c.FaultHook = func(s Step) error {
			if s != step {
				return nil
			}
			hit = true
			if step == StepBound { // something stored before the crash must survive it
				if err := os.WriteFile(filepath.Join(r.root, "etc/kubernetes/kubelet.conf"), []byte("joined"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			return errKilled
		}
	})
	plan, _, err := r.boot(first, key)
	if !errors.Is(err, errKilled) || !hit {
		t.Fatalf("first boot: %v, want the kill at %s", err, step)
	}
	return plan, readDev(t, r.dev, 0, luks2.RecordOffset)
}

func stepAtOrAfter(s, ref Step) bool {
	for _, x := range allSteps {
		if x == ref {
			return true
		}
		if x == s {
			return false
		}
	}
	return false
}

// TestCrashDuringMkfs: mkfs cut short leaves a half-written file system
// (here: garbage where the superblock goes); the record says "mkfs", so
// the next boot makes it again instead of refusing the volume.
func TestCrashDuringMkfs(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(22)
	first := r.stage(func(c *LUKSConfig) {
		c.FaultHook = func(s Step) error {
			if s != StepMkfsStarted {
				return nil
			}
			writeDev(t, r.kernel.maps[DefaultMapperName], 0, randomBytes(mib))
			return errKilled
		}
	})
	if _, _, err := r.boot(first, key); !errors.Is(err, errKilled) {
		t.Fatalf("first boot: %v", err)
	}
	r.kernel.powerOff()
	_, res := r.mustBoot(r.stage(nil), key)
	if !res.MadeFileSystem || res.FSType != "ext4" {
		t.Fatalf("result = %+v", res)
	}
}

// TestReadyFileSystemNeverRemade: once the record says "ready", a file
// system that has gone missing is refused, not recreated, unless the
// operator says WipeStateDisk.
func TestReadyFileSystemNeverRemade(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(23)
	plan, _ := r.mustBoot(r.stage(nil), key)
	r.kernel.powerOff()
	writeDev(t, r.dev, luks2.DataOffset, make([]byte, 64<<10)) // the superblock is gone

	_, _, err := r.boot(r.stage(nil), key)
	if !errors.Is(err, ErrVolumeContent) || r.rec.Ran("mkfs") != 0 {
		t.Fatalf("damaged volume: %v (mkfs ran %d times), want ErrVolumeContent and no mkfs", err, r.rec.Ran("mkfs"))
	}
	if !strings.Contains(err.Error(), "set wipeStateDisk to "+plan.UUID) {
		t.Fatalf("refusal %q does not say what to set", err)
	}
	r.kernel.powerOff()
	// A wipe naming another disk remakes nothing.
	_, _, err = r.boot(r.stage(func(c *LUKSConfig) { c.WipeStateDisk = newUUID() }), key)
	if !errors.Is(err, ErrWipeMismatch) || r.rec.Ran("mkfs") != 0 {
		t.Fatalf("wipe naming another disk: %v (mkfs ran %d times)", err, r.rec.Ran("mkfs"))
	}
	r.kernel.powerOff()
	_, res := r.mustBoot(r.stage(func(c *LUKSConfig) { c.WipeStateDisk = plan.UUID }), key)
	if !res.MadeFileSystem {
		t.Fatalf("with WipeStateDisk: %+v, want the file system remade", res)
	}
}

func TestFailedTicketLeavesBlankDisk(t *testing.T) {
	r := newRig(t, testDiskSize)
	l := r.stage(nil)
	plan, err := l.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The ticket never came. Next boot: still a first boot, new UUID.
	plan2, err := r.stage(nil).Prepare(context.Background())
	if err != nil || plan2.Rejoin || plan2.UUID == plan.UUID {
		t.Fatalf("second Prepare = %+v, %v", plan2, err)
	}
	if !allZero(readDev(t, r.dev, 0, luks2.DataOffset)) {
		t.Fatal("Prepare wrote to the disk")
	}
}

// TestLostPrimaryHeaderOnUsedDiskRefused: a disk that was in use (state
// record written) and lost its primary header is not mistaken for an
// interrupted install: it is refused, never reformatted.
func TestLostPrimaryHeaderOnUsedDiskRefused(t *testing.T) {
	r := newRig(t, testDiskSize)
	r.mustBoot(r.stage(nil), testKey(24))
	r.kernel.powerOff()
	writeDev(t, r.dev, 0, make([]byte, luks2.BinHeaderSize))
	before := checksum(t, r.dev)
	_, err := r.stage(nil).Prepare(context.Background())
	if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), "on a disk that was in use") {
		t.Fatalf("Prepare: %v", err)
	}
	if checksum(t, r.dev) != before {
		t.Fatal("device changed")
	}
}

// TestDiskSwappedAfterPrepare: the plan no longer fits the device.
func TestDiskSwappedAfterPrepare(t *testing.T) {
	r := newRig(t, testDiskSize)
	_, err := r.stage(nil).Open(context.Background(), Plan{UUID: fixtureUUID, Rejoin: true}, Keys{Current: testKey(25)})
	if !errors.Is(err, ErrStateChanged) {
		t.Fatalf("rejoin plan on a blank disk: %v, want ErrStateChanged", err)
	}
	if !allZero(readDev(t, r.dev, 0, luks2.DataOffset)) {
		t.Fatal("formatted a disk the plan said was already ours")
	}
	plan, _ := r.mustBoot(r.stage(nil), testKey(25))
	r.kernel.powerOff()
	_, err = r.stage(nil).Open(context.Background(), Plan{UUID: newUUID()}, Keys{Current: testKey(25)})
	if !errors.Is(err, ErrStateChanged) || !strings.Contains(err.Error(), plan.UUID) {
		t.Fatalf("first-boot plan on a formatted disk: %v, want ErrStateChanged", err)
	}
}

// TestMapFailureIsResumable: the kernel refusing the mapping (no
// dm-crypt, say) stops Open after the header, and the next boot goes on.
func TestMapFailureIsResumable(t *testing.T) {
	r := newRig(t, testDiskSize)
	r.kernel.failOn = "dm-crypt target not available"
	_, _, err := r.boot(r.stage(nil), testKey(26))
	if err == nil || !strings.Contains(err.Error(), "dm-crypt target not available") {
		t.Fatalf("first boot: %v", err)
	}
	r.kernel.failOn = ""
	plan, res := r.mustBoot(r.stage(nil), testKey(26))
	if !plan.Rejoin || res.Formatted || !res.MadeFileSystem {
		t.Fatalf("plan %+v, result %+v", plan, res)
	}
}

// TestInterruptedInstallOverDataRefused: an interrupted header install
// writes nothing past the header area, so one with data behind it (a
// wipe boot cut short, or a disk made to look like an interrupted
// install) is foreign: refused, and redone only when WipeStateDisk names
// the disk.
func TestInterruptedInstallOverDataRefused(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(27)
	plan, _ := crashFirstBoot(t, r, key, StepHeaderPartial)
	r.kernel.powerOff()
	writeDev(t, r.dev, 40*mib, []byte("data latchkey did not write"))
	before := checksum(t, r.dev)
	_, err := r.stage(nil).Prepare(context.Background())
	if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), "an interrupted latchkey header install, over unrecognised non-zero data at byte 41943040 (40 MiB)") ||
		!strings.Contains(err.Error(), `set wipeStateDisk to "`+plan.UUID+`"`) {
		t.Fatalf("Prepare: %v", err)
	}
	if checksum(t, r.dev) != before {
		t.Fatal("device changed")
	}
	plan2, res := r.mustBoot(r.stage(func(c *LUKSConfig) { c.WipeStateDisk = plan.UUID }), key)
	if plan2.Rejoin || !res.Formatted || !res.MadeFileSystem {
		t.Fatalf("with the wipe: plan %+v, result %+v", plan2, res)
	}
}

// TestHeaderOnDiskTooSmallForXFS: a header already on a disk too small
// for xfs (written before the size check existed, or fsType changed
// after a crash before mkfs) is refused with what to change, not by mkfs
// failing at every boot.
func TestHeaderOnDiskTooSmallForXFS(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(28)
	crashFirstBoot(t, r, key, StepHeaderWritten)
	r.kernel.powerOff()
	_, _, err := r.boot(r.stage(func(c *LUKSConfig) { c.FSType = "xfs" }), key)
	if !errors.Is(err, ErrUnusable) || !strings.Contains(err.Error(), "too small for fsType xfs (needs at least 331350016 bytes); use fsType ext4 or a larger disk") ||
		r.rec.Ran("mkfs") != 0 {
		t.Fatalf("boot: %v (mkfs ran %d times)", err, r.rec.Ran("mkfs"))
	}
}
