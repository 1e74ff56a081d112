package disk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
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
	marker := filepath.Join(r.root, "etc/kubernetes/kubelet.conf")
	hit := false
	first := r.stage(func(c *LUKSConfig) {
		c.FaultHook = func(s Step) error {
			if s != step {
				return nil
			}
			hit = true
			if step == StepBound {
				// Something stored before the crash must survive it.
				if err := os.WriteFile(marker, []byte("joined"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			return errKilled
		}
	})
	plan1, _, err := r.boot(first, key)
	if !errors.Is(err, errKilled) || !hit {
		t.Fatalf("first boot: %v, want the kill at %s", err, step)
	}
	header := readDev(t, r.dev, 0, recordOffset) // headers and keyslots area
	if powerCycle {
		r.kernel.powerOff()
	}

	plan2, res, err := r.boot(r.stage(nil), key)
	if err != nil {
		t.Fatalf("boot after the crash: %v", err)
	}
	headerComplete := stepAtOrAfter(step, StepHeaderWritten)
	switch {
	case step == StepFormatted: // the device was never touched
		if plan2.Rejoin || !res.Formatted {
			t.Fatalf("plan %+v, result %+v: want a fresh first boot", plan2, res)
		}
	case step == StepHeaderPartial: // our own interrupted install, redone
		if plan2.UUID != plan1.UUID || plan2.Rejoin || !res.Formatted {
			t.Fatalf("plan %+v, result %+v: want the install redone for %s", plan2, res, plan1.UUID)
		}
	case headerComplete:
		if plan2.UUID != plan1.UUID || !plan2.Rejoin || res.Formatted || r.rec.Ran("cryptsetup") != 0 {
			t.Fatalf("plan %+v, result %+v: want a rejoin without luksFormat", plan2, res)
		}
		if !bytes.Equal(readDev(t, r.dev, 0, recordOffset), header) {
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
	r.mustBoot(r.stage(nil), key)
	r.kernel.powerOff()
	writeDev(t, r.dev, DataOffset, make([]byte, 64<<10)) // the superblock is gone

	_, _, err := r.boot(r.stage(nil), key)
	if !errors.Is(err, ErrVolumeContent) || r.rec.Ran("mkfs") != 0 {
		t.Fatalf("damaged volume: %v (mkfs ran %d times), want ErrVolumeContent and no mkfs", err, r.rec.Ran("mkfs"))
	}
	r.kernel.powerOff()
	_, res := r.mustBoot(r.stage(func(c *LUKSConfig) { c.WipeStateDisk = true }), key)
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
	if !allZero(readDev(t, r.dev, 0, DataOffset)) {
		t.Fatal("Prepare wrote to the disk")
	}
}
