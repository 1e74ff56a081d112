package disk

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/logkey"
)

// Formatting happens in memory first. cryptsetup luksFormat run straight
// on the device fills the keyslots area with random bytes before it
// writes the header, so an agent killed in between would leave a device
// that reads as "unrecognised data" and is never touched again. Instead
// luksFormat formats an anonymous memory file of the same layout, the
// result is validated like any header read from a disk and unsealed once
// with the ticket's key, and only then copied to the device in an order
// with a single commit point:
//
//  1. the secondary header, the keyslots area and the (empty) record gap,
//  2. the primary header's JSON area, then sync,
//  3. the primary binary header (one 4 KiB write), then sync.
//
// Before step 3 the device carries only a secondary header with
// latchkey's label and an empty record gap: classify calls that
// kindInterrupted, and the next run installs a fresh header for the same
// UUID. No key was ever usable and nothing was ever written through a
// mapping, so nothing is lost. After step 3 the header is complete and is
// never rewritten.

// formatImage runs luksFormat on a memory file, writes generation gen
// into its subsystem field, and returns it, checked: the header has
// exactly latchkey's shape and the key unseals it.
func (l *LUKS) formatImage(ctx context.Context, uuid string, key []byte, gen uint32) (*os.File, error) {
	img, err := memFile("latchkey-luks-image", imageSize)
	if err != nil {
		return nil, err
	}
	_, err = l.cfg.Runner.Run(ctx, execx.Cmd{
		Name:       "cryptsetup",
		Args:       luks2.FormatArgs(uuid, "/dev/fd/3"),
		Stdin:      bytes.NewReader(key),
		ExtraFiles: []*os.File{img},
	})
	if err == nil {
		err = stampGeneration(img, gen)
	}
	if err == nil {
		err = checkImage(img, uuid, key, gen)
	}
	if err == nil {
		err = zeroUnusedKeyslots(img)
	}
	if err != nil {
		img.Close()
		return nil, fmt.Errorf("format LUKS2 header: %w", err)
	}
	return img, nil
}

func checkImage(img *os.File, uuid string, key []byte, gen uint32) error {
	head := make([]byte, luks2.HeadAndKeyslot)
	if _, err := img.ReadAt(head, 0); err != nil {
		return err
	}
	h, err := luks2.Validate(head, uuid)
	if err != nil {
		return fmt.Errorf("cryptsetup produced an unexpected header: %w", err)
	}
	if h.Generation != gen || h.Prior != nil || h.Area != luks2.AreaA {
		return fmt.Errorf("the formatted header names generation %d, area %d; want %d, %d", h.Generation, h.Area, gen, luks2.AreaA)
	}
	_, err = unsealDetached(head, key, "", luks2.DataOffset+mib)
	return err
}

// zeroUnusedKeyslots zeroes the keyslots area after keyslot 0's area
// (luksFormat fills it with random bytes), so an interrupted install can
// be told from data by its bytes: every byte it writes there is zero
// (probe.go, classifyInterrupted).
func zeroUnusedKeyslots(img *os.File) error {
	zero := make([]byte, mib)
	for off := int64(luks2.KeyslotsOffset + luks2.KeyslotAreaSize); off < luks2.RecordOffset; off += mib {
		n := min(mib, luks2.RecordOffset-off)
		if _, err := img.WriteAt(zero[:n], off); err != nil {
			return fmt.Errorf("zero the unused keyslots area: %w", err)
		}
	}
	return nil
}

// memFile is an anonymous, sparse, memory-backed file of the given size.
func memFile(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("size memory file: %w", err)
	}
	return f, nil
}

// install copies the formatted image onto the device in commit order.
// wipe also zeroes the first MiB and the last 4 MiB first (WipeStateDisk),
// so the crash states match those of a blank disk and no foreign
// signature (a GPT backup, an md superblock) is left at either end.
func (l *LUKS) install(d *device, img *os.File, wipe bool) error {
	if wipe {
		if err := wipeEnds(d); err != nil {
			return err
		}
	}
	steps := []struct{ from, to int64 }{
		{luks2.SecondaryOffset, luks2.DataOffset},
		{luks2.BinHeaderSize, luks2.SecondaryOffset},
	}
	for _, s := range steps {
		if err := copyRange(d, img, s.from, s.to); err != nil {
			return err
		}
	}
	if err := d.sync(); err != nil {
		return err
	}
	if err := l.fault(StepHeaderPartial); err != nil {
		return err
	}
	if err := copyRange(d, img, 0, luks2.BinHeaderSize); err != nil {
		return err
	}
	if err := d.sync(); err != nil {
		return err
	}
	l.cfg.Logger.Info("state disk: LUKS2 header written", slog.String(logkey.Device, d.path))
	return nil
}

// copyRange copies img[from:to] to the same offsets of the device.
func copyRange(d *device, img *os.File, from, to int64) error {
	buf := make([]byte, min(to-from, mib))
	for off := from; off < to; off += int64(len(buf)) {
		n := min(int64(len(buf)), to-off)
		if _, err := img.ReadAt(buf[:n], off); err != nil && err != io.EOF {
			return fmt.Errorf("read header image: %w", err)
		}
		if err := d.write(buf[:n], off); err != nil {
			return err
		}
	}
	return nil
}

func wipeEnds(d *device) error {
	zero := make([]byte, mib)
	if err := d.write(zero, 0); err != nil {
		return err
	}
	for off := d.size - tailScanLength; off < d.size; off += mib {
		if err := d.write(zero, off); err != nil {
			return err
		}
	}
	return d.sync()
}
