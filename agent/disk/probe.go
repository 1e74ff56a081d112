package disk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/internal/execx"
)

// kind is what classify found on the device.
type kind int

const (
	// kindBlank: nothing anywhere (fullcheck.go: every byte zero; or,
	// under the sampled rule, scan.go and blkid found nothing).
	kindBlank kind = iota
	// kindOurs: a complete LUKS2 header of exactly latchkey's shape.
	kindOurs
	// kindInterrupted: latchkey's own header install was cut short before
	// its commit point (the primary binary header): the secondary header
	// is there, the primary is not, and no state record was ever written,
	// so nothing was ever unlocked or stored. Completing it loses nothing.
	kindInterrupted
	// kindForeign: anything else; never formatted unless WipeStateDisk
	// names this disk.
	kindForeign
)

// probe is the outcome of classify.
type probe struct {
	kind kind
	uuid string // kindOurs, kindInterrupted; kindForeign: a LUKS header's UUID
	head []byte // the first MiB as read (kindOurs: the validated copy)
	what string // kindForeign: what was found, and where
	err  error  // kindForeign from a rejected LUKS2 header: why
	// altered: a LUKS2 header with latchkey's label that fails
	// validation: latchkey's own disk, changed since it was made.
	altered bool
	// hdr is the validated header (kindOurs).
	hdr *luks2.Header
	// rule is the blank-check rule that admitted a kindBlank or
	// kindInterrupted device.
	rule string
	// rewrapped: settleGeneration wrote (or began to write) a rewrapped
	// header, so a later failure is not "nothing was written".
	rewrapped bool
}

// classify reads the device and decides what it is. The order matters:
// LUKS magic first (so our own header is recognised with one read on
// every reboot), then our own interrupted install, then the blank-device
// check: every byte read and zero (the default), or the sampled rule
// (scan.go) and blkid. proven says Prepare read the whole device under a
// lock held without a gap since (lock.go): then only both ends are read
// again.
func (l *LUKS) classify(ctx context.Context, d *device, proven bool) (probe, error) {
	head, err := d.read(0, blankCheckLength)
	if err != nil {
		return probe{}, err
	}
	if p, done := classifyLUKS(head); done {
		return p, nil
	}
	if p, done, err := l.classifyInterrupted(ctx, d, head, proven); err != nil || done {
		return p, err
	}
	if l.cfg.BlankCheck == BlankCheckSampled {
		return l.classifySampled(ctx, d, head)
	}
	off, err := l.zeroFrom(ctx, d, 0, proven)
	if err != nil {
		return probe{}, err
	}
	if off >= 0 {
		what, err := l.nameData(ctx, d, off, 0)
		if err != nil {
			return probe{}, err
		}
		return foreign(head, what), nil
	}
	return probe{kind: kindBlank, head: head, rule: BlankCheckFull}, nil
}

// zeroFrom returns the first non-zero byte from byte from on, or -1.
// With proven, both ends are read again (the first 16 MiB and the last
// 4 MiB, where a writer that takes no lock most likely wrote) and, when
// they are zero, the rest stands as Prepare proved it.
func (l *LUKS) zeroFrom(ctx context.Context, d *device, from int64, proven bool) (int64, error) {
	if proven {
		head, err := d.read(from, int(luks2.DataOffset-min(from, luks2.DataOffset)))
		if err != nil {
			return 0, err
		}
		tail, err := d.read(d.size-tailScanLength, tailScanLength)
		if err != nil {
			return 0, err
		}
		if firstNonZeroFast(head) < 0 && firstNonZeroFast(tail) < 0 {
			return -1, nil
		}
	}
	return l.fullCheck(ctx, d, from)
}

// classifySampled is the blank-device check of disk.blankCheck: sampled.
func (l *LUKS) classifySampled(ctx context.Context, d *device, head []byte) (probe, error) {
	res, err := scanDevice(ctx, d, 0)
	if err != nil {
		return probe{}, err
	}
	if !res.blank() {
		return foreign(head, l.name(ctx, d, res)), nil
	}
	found, err := l.blkid(ctx, d.path, 0)
	if err != nil {
		return probe{}, err
	}
	if found != "" {
		return foreign(head, found+" at byte 0"), nil
	}
	return probe{kind: kindBlank, head: head, rule: BlankCheckSampled}, nil
}

// name describes a non-blank scan result; where the table named nothing,
// libblkid is asked for a second opinion at the 1 MiB-aligned offset of
// the first non-zero byte (one run, on a device being refused anyway).
func (l *LUKS) name(ctx context.Context, d *device, res scanResult) string {
	if res.sig == nil && res.data != nil {
		off := res.data.off &^ (candidateStride - 1)
		if found, err := l.blkid(ctx, d.path, off); err == nil && found != "" {
			return fmt.Sprintf("%s at %s", found, at(off))
		}
	}
	return res.describe()
}

func foreign(head []byte, what string) probe {
	return probe{kind: kindForeign, head: head, what: what}
}

// classifyLUKS handles a primary LUKS magic at offset 0.
func classifyLUKS(head []byte) (probe, bool) {
	if string(head[:6]) != luks2.PrimaryMagic {
		return probe{}, false
	}
	switch v := binary.BigEndian.Uint16(head[luks2.OffVersion:]); v {
	case 1:
		p := foreign(head, "a LUKS1 header at byte 0")
		p.uuid = luks2.ParseBinary(head).UUID
		return p, true
	case 2:
		h, err := luks2.Validate(head, "")
		if err != nil {
			bin := luks2.ParseBinary(head)
			p := foreign(head, fmt.Sprintf("a LUKS2 header latchkey did not create (label %q) at byte 0", bin.Label))
			p.err, p.uuid = err, bin.UUID
			if luks2.MadeByLatchkey(head) {
				p.what, p.altered = "latchkey's LUKS2 header, altered since latchkey wrote it", true
			}
			return p, true
		}
		return probe{kind: kindOurs, uuid: h.UUID, head: head, hdr: h}, true
	default:
		return foreign(head, fmt.Sprintf("a LUKS header of unknown version %d", v)), true
	}
}

// classifyInterrupted recognises latchkey's cut-short header install by
// latchkey's own bytes only, and proves the premise that redoing it
// loses nothing: no primary binary header (its 4 KiB are zero), a
// secondary header that is exactly latchkey's (every field and its JSON,
// as validated for a complete header), a primary JSON area that is empty
// or the secondary's, keyslot 0's area (latchkey's key material, proved
// in Open with the ticket's key: ownKeyslot), and zero everywhere else the install
// writes: the rest of the keyslots area (the install zeroes it) and the
// state-record gap. The install writes nothing past the header area, so
// the rest of the device must pass the blank-device check too. Anything
// else is foreign, named, and redone only if WipeStateDisk names the
// disk.
func (l *LUKS) classifyInterrupted(ctx context.Context, d *device, head []byte, proven bool) (probe, bool, error) {
	if !allZero(head[:luks2.BinHeaderSize]) || string(head[luks2.SecondaryOffset:luks2.SecondaryOffset+6]) != luks2.SecondaryMagic {
		return probe{}, false, nil
	}
	uuid, ok := luks2.InstallSecondary(head)
	if !ok {
		return foreign(head, "a secondary LUKS2 header without a primary header"), true, nil
	}
	gap, err := d.read(luks2.RecordOffset, 2*luks2.RecordSlotSize)
	if err != nil {
		return probe{}, false, err
	}
	if !allZero(gap) {
		return foreign(head, "a secondary LUKS2 header without a primary header, on a disk that was in use"), true, nil
	}
	if why := luks2.CheckInterruptedSecondary(head); why != "" {
		p := foreign(head, "a secondary LUKS2 header with latchkey's label that latchkey did not write ("+why+")")
		p.uuid = uuid
		return p, true, nil
	}
	area, err := d.read(0, luks2.DataOffset)
	if err != nil {
		return probe{}, false, err
	}
	over := int64(-1)
	if i := firstNonZeroFast(area[luks2.KeyslotsOffset+luks2.KeyslotAreaSize:]); i >= 0 {
		over = int64(luks2.KeyslotsOffset + luks2.KeyslotAreaSize + i)
	} else if l.cfg.BlankCheck == BlankCheckSampled {
		res, err := scanDevice(ctx, d, luks2.DataOffset)
		if err != nil {
			return probe{}, false, err
		}
		if !res.blank() {
			p := foreign(head, "an interrupted latchkey header install, over "+res.describe())
			p.uuid = uuid
			return p, true, nil
		}
	} else if over, err = l.zeroFrom(ctx, d, luks2.DataOffset, proven); err != nil {
		return probe{}, false, err
	}
	if over >= 0 {
		what, err := l.nameData(ctx, d, over, luks2.KeyslotsOffset+luks2.KeyslotAreaSize)
		if err != nil {
			return probe{}, false, err
		}
		p := foreign(head, "an interrupted latchkey header install, over "+what)
		p.uuid = uuid
		return p, true, nil
	}
	return probe{kind: kindInterrupted, uuid: uuid, head: head, rule: l.cfg.BlankCheck}, true, nil
}

// blkid asks libblkid's low-level probes (the same detection udev and
// wipefs use) what the device holds at offset off; "" means nothing.
func (l *LUKS) blkid(ctx context.Context, path string, off int64) (string, error) {
	fields, err := l.blkidFields(ctx, path, off)
	if err != nil || len(fields) == 0 {
		return "", err
	}
	var parts []string
	if t := fields["TYPE"]; t != "" {
		parts = append(parts, fmt.Sprintf("%s (%s)", t, orDefault(fields["USAGE"], "signature")))
	}
	if pt := fields["PTTYPE"]; pt != "" {
		parts = append(parts, fmt.Sprintf("a %s partition table", pt))
	}
	if len(parts) == 0 {
		return "", nil
	}
	return strings.Join(parts, " and ") + " [blkid]", nil
}

// blkidFields runs `blkid -p -o export` (at offset off) and returns its
// KEY=value lines. Exit status 2 is blkid's "nothing found", an answer
// rather than a failure, so it is logged at debug level.
func (l *LUKS) blkidFields(ctx context.Context, path string, off int64) (map[string]string, error) {
	args := []string{"-p", "-o", "export", path}
	if off > 0 {
		args = []string{"-p", "-O", strconv.FormatInt(off, 10), "-o", "export", path}
	}
	res, err := l.cfg.Runner.Run(ctx, execx.Cmd{Name: "blkid", Args: args, AnswerExitCodes: []int{2}})
	if execx.ExitCode(err) == 2 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", path, err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			fields[k] = strings.ReplaceAll(v, `\ `, " ")
		}
	}
	return fields, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ownKeyslot proves the one region of an interrupted install Prepare
// cannot compare, keyslot 0's area (latchkey's AF-split key material):
// with the ticket's key, which exists only once attestation succeeded. A
// copy of the secondary header, made primary (magic, offset and
// checksum), is unsealed from memory; if a key of the ticket opens it,
// every byte of that area is what latchkey's luksFormat wrote for this
// disk.
func ownKeyslot(head []byte, keys Keys, size int64) error {
	img := luks2.PromoteSecondary(head)
	var last error
	for _, k := range [][]byte{keys.Current, keys.Previous} {
		if len(k) == 0 {
			continue
		}
		_, err := unsealDetached(img, k, "", size)
		if err == nil {
			return nil
		}
		last = err
	}
	if last == nil {
		last = errors.New("no key")
	}
	return fmt.Errorf("the ticket's keys do not open it: %w", last)
}
