package disk

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/logkey"
)

// ensureFileSystem makes sure the opened volume at mapped holds the state
// file system and returns its type and whether this run made it. The
// state record decides (see luks2/record.go):
//
//   - no record: nothing was ever written through a mapping, so the
//     volume is fresh; record "mkfs", make the file system, record "ready";
//   - "mkfs": an earlier run was cut short during mkfs; make it again;
//   - "ready": the file system must be there and is never remade; a
//     missing or different one is refused unless WipeStateDisk names
//     this disk (its LUKS UUID is uuid).
func (l *LUKS) ensureFileSystem(ctx context.Context, d *device, mapped, uuid string) (string, bool, error) {
	rec, err := readRecord(d, uuid)
	if err != nil {
		return "", false, err
	}
	switch {
	case rec == nil:
		found, err := l.fsType(ctx, mapped)
		if err != nil {
			return "", false, err
		}
		if found != "" {
			what := fmt.Sprintf("a new volume that already holds %s, which latchkey never made", found)
			if ok, err := l.wipeAllowed(d, uuid, what); err != nil || !ok {
				return "", false, fmt.Errorf("%w: %s (set wipeStateDisk to %s to remake it): %v", ErrVolumeContent, what, uuid, err)
			}
		}
		return l.makeFileSystem(ctx, d, mapped, uuid, nil)
	case rec.State == luks2.RecordMkfs:
		l.cfg.Logger.Info("state disk: finishing an interrupted mkfs", slog.String(logkey.FSType, l.cfg.FSType))
		return l.makeFileSystem(ctx, d, mapped, uuid, rec)
	}
	found, err := l.fsType(ctx, mapped)
	if err != nil {
		return "", false, err
	}
	if found == rec.FSType {
		return found, false, nil
	}
	what := fmt.Sprintf("a volume whose %s file system is gone (now: %q)", rec.FSType, found)
	ok, err := l.wipeAllowed(d, uuid, what)
	switch {
	case err != nil:
		return "", false, fmt.Errorf("%w: %w", ErrVolumeContent, err)
	case ok:
		l.cfg.Logger.Warn("state disk: remaking a damaged file system", slog.String(logkey.Want, rec.FSType), slog.String(logkey.Found, found))
		return l.makeFileSystem(ctx, d, mapped, uuid, rec)
	case found == "":
		return "", false, fmt.Errorf("%w: the %s file system latchkey made is gone (damaged?); not remaking it (repair it, or set wipeStateDisk to %s to start over)", ErrVolumeContent, rec.FSType, uuid)
	}
	return "", false, fmt.Errorf("%w: volume holds %s, latchkey made %s", ErrVolumeContent, found, rec.FSType)
}

// makeFileSystem records "mkfs", runs mkfs, records "ready".
func (l *LUKS) makeFileSystem(ctx context.Context, d *device, mapped, uuid string, prev *luks2.Record) (string, bool, error) {
	fstype := l.cfg.FSType
	if need := minSize(fstype); d.size < need {
		// A header an older agent wrote on a disk too small for the file
		// system: say so instead of failing in mkfs at every boot.
		return "", false, fmt.Errorf("%w: state disk %s is %d bytes, too small for fsType %s (needs at least %d bytes); use fsType ext4 or a larger disk",
			ErrUnusable, d.path, d.size, fstype, need)
	}
	rec, err := writeRecord(d, prev, luks2.Record{UUID: uuid, State: luks2.RecordMkfs, FSType: fstype})
	if err != nil {
		return "", false, err
	}
	if err := l.fault(StepMkfsStarted); err != nil {
		return "", false, err
	}
	if _, err := l.cfg.Runner.Run(ctx, mkfsCmd(fstype, mapped)); err != nil {
		return "", false, fmt.Errorf("make %s file system: %w", fstype, err)
	}
	if err := l.fault(StepFileSystemMade); err != nil {
		return "", false, err
	}
	if _, err := writeRecord(d, rec, luks2.Record{UUID: uuid, State: luks2.RecordReady, FSType: fstype}); err != nil {
		return "", false, err
	}
	l.cfg.Logger.Info("state disk: file system made", slog.String(logkey.FSType, fstype), slog.String(logkey.Device, mapped))
	return fstype, true, l.fault(StepFileSystemReady)
}

// mkfsCmd forces (-F/-f): the record says this volume is latchkey's and
// not yet or only partly formatted; discards are skipped because the
// mapping does not pass them down.
func mkfsCmd(fstype, dev string) execx.Cmd {
	if fstype == "xfs" {
		return execx.Cmd{Name: "mkfs.xfs", Args: []string{"-q", "-f", "-K", "-L", FSLabel, dev}}
	}
	return execx.Cmd{Name: "mkfs.ext4", Args: []string{"-q", "-F", "-L", FSLabel, "-E", "nodiscard", dev}}
}

// fsType is the TYPE blkid finds on the opened volume ("" for none).
func (l *LUKS) fsType(ctx context.Context, dev string) (string, error) {
	fields, err := l.blkidFields(ctx, dev, 0)
	if err != nil {
		return "", err
	}
	return fields["TYPE"], nil
}

// readRecord returns the newest valid state record (luks2.NewestRecord):
// nil when both slots are blank, ErrVolumeContent when a slot holds
// something that is not a record, or a record of another disk.
func readRecord(d *device, uuid string) (*luks2.Record, error) {
	raw, err := d.read(luks2.RecordOffset, 2*luks2.RecordSlotSize)
	if err != nil {
		return nil, err
	}
	rec, err := luks2.NewestRecord(raw, uuid)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrVolumeContent, err)
	}
	return rec, nil
}

// writeRecord writes rec with the next sequence number into the slot the
// newer record does not occupy, and syncs.
func writeRecord(d *device, prev *luks2.Record, rec luks2.Record) (*luks2.Record, error) {
	if prev != nil {
		rec.Seq = prev.Seq + 1
	}
	slot, off, err := luks2.EncodeRecord(rec)
	if err != nil {
		return nil, err
	}
	if err := d.write(slot, off); err != nil {
		return nil, err
	}
	return &rec, d.sync()
}
