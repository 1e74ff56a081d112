package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"golang.org/x/sys/unix"
)

func TestOffsetsAreExact(t *testing.T) {
	for off, want := range map[int64]string{
		0:                    "byte 0",
		440:                  "byte 440",
		mib - 1:              "byte 1048575",
		128 * mib:            "byte 134217728 (128 MiB)",
		128*mib + 1:          "byte 134217729 (128 MiB + 1 byte)",
		20*mib + 8192:        "byte 20979712 (20 MiB + 8 KiB)",
		63*512 + 3*cylinder:  "byte 24708096 (23 MiB + 577 KiB)",
		64*mib + 100*1024:    "byte 67211264 (64 MiB + 100 KiB)",
		1<<40 + 3*mib + 1000: "byte 1099514774504 (1048579 MiB + 1000 bytes)",
	} {
		if got := at(off); got != want {
			t.Errorf("at(%d) = %q, want %q", off, got, want)
		}
	}
}

func TestZeroTestFindsEveryByte(t *testing.T) {
	b := make([]byte, 3*16384+100)
	if i := firstNonZeroFast(b); i != -1 || firstNonZeroFast(nil) != -1 {
		t.Fatalf("zero buffer: %d", i)
	}
	for _, i := range []int{0, 1, 16383, 16384, 2*16384 + 7, len(b) - 2, len(b) - 1} {
		b[i] = 0x80
		if got := firstNonZeroFast(b); got != i {
			t.Errorf("non-zero byte at %d found at %d", i, got)
		}
		b[i] = 0
	}
	// Built to slip past an "all bytes equal" test: every byte the same
	// non-zero value.
	for i := range b {
		b[i] = 7
	}
	if got := firstNonZeroFast(b); got != 0 {
		t.Errorf("a buffer of 7s: %d", got)
	}
}

// TestFirstBootReadsTheDeviceOnce: Prepare proves the device blank and
// keeps its lock; Open converts it without a gap and does not read the
// whole device again. The log names the rule that admitted the disk.
func TestFirstBootReadsTheDeviceOnce(t *testing.T) {
	r := newRig(t, 256*mib)
	var progress []string
	l := r.stage(func(c *LUKSConfig) { c.Progress = func(s string, _ time.Duration) { progress = append(progress, s) } })
	_, res := r.mustBoot(l, testKey(40))
	if !res.Formatted {
		t.Fatalf("result %+v", res)
	}
	logs := r.logs.String()
	if n := strings.Count(logs, "state disk: blank check done"); n != 1 {
		t.Fatalf("the whole device was read %d times, want once:\n%s", n, logs)
	}
	for _, want := range []string{`"msg":"state disk: blank, admitted for a first boot"`, `"blank_check":"full"`, `"bytes_read":268435456`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s", want)
		}
	}
	if len(progress) == 0 || !strings.Contains(progress[len(progress)-1], "268435456 of 268435456 bytes read (100%") {
		t.Errorf("progress: %q", progress)
	}
}

// TestLockLostBetweenPrepareAndOpenReadsAgain: when another holder keeps
// Open from converting Prepare's lock, the proof no longer stands and
// Open reads the whole device again from its locked descriptor.
func TestLockLostBetweenPrepareAndOpenReadsAgain(t *testing.T) {
	r := newRig(t, 128*mib)
	holder, err := os.Open(r.dev)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	released := false
	l := r.stage(func(c *LUKSConfig) {
		c.PollInterval = time.Millisecond
		c.Sleep = func(ctx context.Context, _ time.Duration) error {
			if !released { // Open is waiting for the exclusive lock
				unix.Flock(int(holder.Fd()), unix.LOCK_UN)
				released = true
			}
			return nil
		}
	})
	plan, err := l.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		t.Fatalf("a second shared lock: %v", err)
	}
	writeDev(t, r.dev, 100*mib+3, []byte("written while the lock was not held"))
	_, err = l.Open(context.Background(), plan, Keys{Current: testKey(41)})
	if !released || !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), "unrecognised non-zero data at byte 104857603 (100 MiB + 3 bytes)") {
		t.Fatalf("Open after the lock was lost: %v (released %v)", err, released)
	}
	if n := strings.Count(r.logs.String(), "state disk: blank check done"); n != 2 {
		t.Fatalf("the device was read %d times, want twice", n)
	}
}

// TestInterruptedInstallOverForeignHeaderArea: after a real first boot
// that wrote its header (the mapping then failed), the primary header is
// zeroed and an ext4 with files is made at 2 MiB, inside the keyslots
// area the install rewrites. That is not latchkey's interrupted install:
// refused naming the file system, the device unchanged.
func TestInterruptedInstallOverForeignHeaderArea(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(42)
	r.kernel.failOn = "dm-crypt target not available"
	_, _, err := r.boot(r.stage(nil), key)
	if !errors.Is(err, ErrHeaderWritten) {
		t.Fatalf("first boot: %v, want ErrHeaderWritten", err)
	}
	r.kernel.failOn = ""
	writeDev(t, r.dev, 0, make([]byte, luks2.BinHeaderSize))
	atOffset(t, r.dev, 2*mib, 8*mib, mkext4(t, withFiles(t)))
	before := checksum(t, r.dev)
	for _, rule := range []string{BlankCheckFull, BlankCheckSampled} {
		_, err = r.stage(func(c *LUKSConfig) { c.BlankCheck = rule }).Prepare(context.Background())
		want := "an interrupted latchkey header install, over an ext2/3/4 file system at byte 2097152 (2 MiB)"
		if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: Prepare: %v\nwant %q", rule, err, want)
		}
	}
	if checksum(t, r.dev) != before || r.rec.Ran("cryptsetup luksFormat") != 0 {
		t.Fatal("device changed")
	}
}

// TestInterruptedInstallProvedByItsOwnBytes: an interrupted install is
// redone only when every byte is latchkey's; each edit an attacker (or
// an accident) can make to one is refused with what was found.
func TestInterruptedInstallProvedByItsOwnBytes(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(t *testing.T, dev string)
		want string
	}{
		{"one byte after keyslot 0's area", func(t *testing.T, dev string) {
			writeDev(t, dev, luks2.KeyslotsOffset+luks2.KeyslotAreaSize+5, []byte{1})
		}, "an interrupted latchkey header install, over unrecognised non-zero data at byte 290821"},
		{"the secondary header's JSON edited", func(t *testing.T, dev string) {
			b := readDev(t, dev, luks2.SecondaryOffset+luks2.BinHeaderSize, 1)
			writeDev(t, dev, luks2.SecondaryOffset+luks2.BinHeaderSize, []byte{b[0] ^ 0x20})
		}, "a secondary LUKS2 header with latchkey's label that latchkey did not write (secondary header: checksum mismatch)"},
		{"a primary JSON area that is not the secondary's", func(t *testing.T, dev string) {
			writeDev(t, dev, luks2.BinHeaderSize, []byte(`{"keyslots":{}}`))
		}, "the primary JSON area is neither empty nor the secondary's"},
		{"data in the data segment", func(t *testing.T, dev string) {
			writeDev(t, dev, luks2.DataOffset+4096+17, []byte("x"))
		}, "an interrupted latchkey header install, over unrecognised non-zero data at byte 16781329 (16 MiB + 4113 bytes)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, testDiskSize)
			crashFirstBoot(t, r, testKey(43), StepHeaderPartial)
			r.kernel.powerOff()
			c.edit(t, r.dev)
			before := checksum(t, r.dev)
			_, err := r.stage(nil).Prepare(context.Background())
			if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Prepare: %v\nwant %q", err, c.want)
			}
			if checksum(t, r.dev) != before {
				t.Fatal("device changed")
			}
		})
	}
	// Keyslot 0's area is proved in Open, with the ticket's key: an
	// install whose key material was replaced is refused there, before
	// anything is written.
	r0 := newRig(t, testDiskSize)
	crashFirstBoot(t, r0, testKey(43), StepHeaderPartial)
	r0.kernel.powerOff()
	writeDev(t, r0.dev, luks2.KeyslotsOffset+8192, randomNoMagic(4096))
	before := checksum(t, r0.dev)
	l := r0.stage(nil)
	plan0, err := l.Prepare(context.Background())
	if err != nil {
		t.Fatalf("Prepare (keyslot 0's area is not compared there): %v", err)
	}
	_, err = l.Open(context.Background(), plan0, Keys{Current: testKey(43)})
	if !errors.Is(err, ErrForeignData) || errors.Is(err, ErrHeaderWritten) ||
		!strings.Contains(err.Error(), "an interrupted latchkey header install whose keyslot 0 area is not latchkey's (the ticket's keys do not open it") {
		t.Fatalf("Open: %v", err)
	}
	if checksum(t, r0.dev) != before {
		t.Fatal("device changed")
	}
	// The control: untouched, it is redone.
	r := newRig(t, testDiskSize)
	plan, _ := crashFirstBoot(t, r, testKey(43), StepHeaderPartial)
	r.kernel.powerOff()
	plan2, res := r.mustBoot(r.stage(nil), testKey(43))
	if plan2.UUID != plan.UUID || !res.Formatted || !strings.Contains(r.logs.String(), "checked byte for byte; it will be redone") {
		t.Fatalf("control: plan %+v, result %+v", plan2, res)
	}
}

// TestLabelOrSubsystemChangeIsStillOwnDisk: the node's own disk is
// recognised by what latchkey wrote, not by its label: after
// `cryptsetup config --label --subsystem` the refusal points to the
// recovery path (never to wiping), and restoring both brings the disk
// back with its data.
func TestLabelOrSubsystemChangeIsStillOwnDisk(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(44)
	plan, _ := r.mustBoot(r.stage(nil), key)
	if err := os.WriteFile(filepath.Join(r.root, "etc/kubernetes/kubelet.conf"), []byte("joined"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.kernel.powerOff()
	subsystem := cString(readDev(t, r.dev, luks2.OffSubsystem, 48))
	run(t, nil, "cryptsetup", "config", "--batch-mode", "--label", "scratch", "--subsystem", "backup", r.dev)
	before := checksum(t, r.dev)
	_, err := r.stage(nil).Prepare(context.Background())
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	for _, want := range []string{"latchkey's LUKS2 header, altered since latchkey wrote it", `subsystem "backup"`,
		"its data is still there", `docs/disk.md, "Recovering an altered header"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q lacks %q", msg, want)
		}
	}
	if !errors.Is(err, ErrHeaderRejected) || strings.Contains(strings.ToLower(msg), "wipe") {
		t.Fatalf("refusal %v: want ErrHeaderRejected and no hint to wipe", err)
	}
	if checksum(t, r.dev) != before {
		t.Fatal("device changed")
	}
	run(t, nil, "cryptsetup", "config", "--batch-mode", "--label", luks2.HeaderLabel, "--subsystem", subsystem, r.dev)
	plan2, res := r.mustBoot(r.stage(nil), key)
	if !plan2.Rejoin || plan2.UUID != plan.UUID || res.Formatted || !res.HasKubeletCredentials {
		t.Fatalf("after restoring the label: plan %+v, result %+v; want the node's own disk back, data intact", plan2, res)
	}
}

// TestForeignLUKS2KeepsTheWipeHint: the control for the above: a LUKS2
// header latchkey did not create (cryptsetup's defaults) still gets the
// wipe hint, not the recovery path.
func TestForeignLUKS2KeepsTheWipeHint(t *testing.T) {
	r := newRig(t, testDiskSize)
	run(t, testKey(9), "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--pbkdf", "pbkdf2",
		"--pbkdf-force-iterations", "1000", "--key-file", "-", r.dev)
	_, err := r.stage(nil).Prepare(context.Background())
	if err == nil || !strings.Contains(err.Error(), "a LUKS2 header latchkey did not create") || !strings.Contains(err.Error(), "wipeStateDisk") {
		t.Fatalf("Prepare: %v", err)
	}
	if bytes.Contains([]byte(err.Error()), []byte("Recovering an altered header")) {
		t.Fatalf("a foreign header pointed to the recovery path: %v", err)
	}
}

// TestFullCheckSurvivesInterruptedAndShortWaits: a wait for completions
// that a signal interrupts (EINTR, as the runtime's preemption signal
// does) or that returns fewer completions than there are (one at a time)
// loses no read: the check still reads every byte of a blank device and
// finds the first non-zero byte exactly, with the eventfd wait and with
// the blocking one. With the eventfd, io_getevents is never asked to
// block: a raw system call that blocked would hold its thread and P.
func TestFullCheckSurvivesInterruptedAndShortWaits(t *testing.T) {
	size := int64(32*mib + 4096) // a short last request
	r := newRig(t, size)
	l := r.stage(nil)
	d, err := openDevice(r.dev, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	next, chunk, depth := getEvents, fullCheckChunk, fullCheckDepth
	defer func() { getEvents, fullCheckChunk, fullCheckDepth, fullCheckPolledWait = next, chunk, depth, true }()
	fullCheckChunk, fullCheckDepth = mib, 4
	for _, polled := range []bool{true, false} {
		for _, fault := range []string{"interrupted", "one-at-a-time"} {
			fullCheckPolledWait = polled
			calls, faults, blocking := 0, 0, 0
			getEvents = func(ctx uint64, minNr int, events []aioEvent, look bool) (int, unix.Errno) {
				calls++
				if !look {
					blocking++
				}
				if fault == "interrupted" && calls%2 == 1 {
					faults++
					return 0, unix.EINTR
				}
				if fault == "one-at-a-time" {
					if len(events) > 1 {
						faults++
					}
					return next(ctx, min(minNr, 1), events[:1], look)
				}
				return next(ctx, minNr, events, look)
			}
			name := fmt.Sprintf("polled=%v/%s", polled, fault)
			for _, c := range []struct{ data, want int64 }{{-1, -1}, {size - 1, size - 1}, {9*mib + 3, 9*mib + 3}} {
				if c.data >= 0 {
					writeDev(t, r.dev, c.data, []byte{0x80})
				}
				got, err := l.fullCheck(context.Background(), d, 0)
				if c.data >= 0 {
					writeDev(t, r.dev, c.data, []byte{0})
				}
				if err != nil || got != c.want {
					t.Errorf("%s: byte at %d: %d, %v; want %d", name, c.data, got, err, c.want)
				}
			}
			if faults == 0 {
				t.Errorf("%s: the fault was never injected (%d waits)", name, calls)
			}
			if polled && blocking != 0 {
				t.Errorf("%s: %d of %d calls of io_getevents could block", name, blocking, calls)
			}
			if !polled && blocking != calls {
				t.Errorf("%s: %d of %d calls of io_getevents blocked; want all (the blocking wait)", name, blocking, calls)
			}
		}
	}
}

// TestFullCheckFindsTheFirstByteInEveryShape: whatever its request size
// and depth, through AIO or blocking preads, the full check reports the
// lowest non-zero offset exactly and, on a blank device, that it read
// every byte. Built to slip past it: a second non-zero byte in a later
// request in flight at the same time, which completes after (or before)
// the earlier one's.
func TestFullCheckFindsTheFirstByteInEveryShape(t *testing.T) {
	size := int64(32*mib + 4096) // a short last request
	r := newRig(t, size)
	var status string
	l := r.stage(func(c *LUKSConfig) { c.Progress = func(s string, _ time.Duration) { status = s } })
	d, err := openDevice(r.dev, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	chunk, depth := fullCheckChunk, fullCheckDepth
	defer func() { fullCheckChunk, fullCheckDepth, useAIO, fullCheckPolledWait = chunk, depth, true, true }()
	for _, s := range []struct {
		chunk, depth int64
		aio, polled  bool
	}{{4 * mib, 2, true, true}, {256 << 10, 32, true, true}, {64 << 10, 3, true, true},
		{4 * mib, 4, true, false}, {64 << 10, 3, true, false}, {4 * mib, 2, false, false}, {1 * mib, 5, false, false}} {
		fullCheckChunk, fullCheckDepth, useAIO, fullCheckPolledWait = s.chunk, s.depth, s.aio, s.polled
		name := fmt.Sprintf("%dKiB-x%d-aio=%v-polled=%v", s.chunk>>10, s.depth, s.aio, s.polled)
		check := func(from int64, data []int64, want int64) {
			t.Helper()
			for _, off := range data {
				writeDev(t, r.dev, off, []byte{0x01})
				defer writeDev(t, r.dev, off, []byte{0})
			}
			got, err := l.fullCheck(context.Background(), d, from)
			if err != nil || got != want {
				t.Errorf("%s: bytes at %v, from %d: %d, %v; want %d", name, data, from, got, err, want)
			}
		}
		check(0, nil, -1)
		if want := fmt.Sprintf("%d of %d bytes read", size, size); !strings.Contains(status, want) {
			t.Errorf("%s: last progress %q, want %q", name, status, want)
		}
		check(0, []int64{0}, 0)
		check(0, []int64{size - 1}, size-1)
		check(0, []int64{256<<10 - 1}, 256<<10-1)
		check(0, []int64{20*mib + 5, 30 * mib, size - 1}, 20*mib+5)
		check(0, []int64{31 * mib, 4*mib + 4095}, 4*mib+4095)
		check(0, []int64{mib + 1, mib + 256<<10 + 1, mib + 512<<10}, mib+1)
		check(8*mib, []int64{8*mib - 1}, -1)
		check(8*mib, []int64{8*mib - 1, 8 * mib}, 8*mib)
	}
}
