package disk

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/protocol"
)

// kind is what classify found on the device.
type kind int

const (
	// kindBlank: nothing anywhere (scan.go: the first 16 MiB and last
	// 4 MiB all zeros, no signature at any 1 MiB-aligned offset, every
	// sample zero, nothing blkid recognises).
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
	hdr *header
}

// classify reads the device and decides what it is. The order matters:
// LUKS magic first (so our own header is recognised with one read on
// every reboot), then our own interrupted install, then the blank-device
// check (scan.go), and only a device on which it finds nothing, and on
// which blkid finds nothing either, is blank.
func (l *LUKS) classify(ctx context.Context, d *device) (probe, error) {
	head, err := d.read(0, blankCheckLength)
	if err != nil {
		return probe{}, err
	}
	if p, done := classifyLUKS(head); done {
		return p, nil
	}
	if p, done, err := l.classifyInterrupted(ctx, d, head); err != nil || done {
		return p, err
	}
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
	return probe{kind: kindBlank, head: head}, nil
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
	if !bytes.Equal(head[:6], primaryMagic) {
		return probe{}, false
	}
	switch v := binary.BigEndian.Uint16(head[offVersion:]); v {
	case 1:
		p := foreign(head, "a LUKS1 header at byte 0")
		p.uuid = cString(head[offUUID : offUUID+40])
		return p, true
	case 2:
		h, err := validateHeader(head, "")
		if err != nil {
			bin := parseBinHeader(head)
			p := foreign(head, fmt.Sprintf("a LUKS2 header latchkey did not create (label %q) at byte 0", bin.label))
			p.err, p.uuid = err, bin.uuid
			if bin.label == HeaderLabel {
				p.what, p.altered = "latchkey's LUKS2 header, altered since latchkey wrote it", true
			}
			return p, true
		}
		return probe{kind: kindOurs, uuid: h.uuid, head: head, hdr: h}, true
	default:
		return foreign(head, fmt.Sprintf("a LUKS header of unknown version %d", v)), true
	}
}

// classifyInterrupted recognises latchkey's cut-short header install: no
// primary header at all (its 4 KiB are zero), a secondary binary header
// with latchkey's label and sizes, and an empty state-record gap. The
// install writes nothing past the header area, so the rest of the device
// must pass the blank-device check too: an interrupted install over data
// (a WipeStateDisk boot cut short, or a disk made to look like one) is
// foreign, and redone only if WipeStateDisk still names the disk.
func (l *LUKS) classifyInterrupted(ctx context.Context, d *device, head []byte) (probe, bool, error) {
	sec := head[secondaryOffset : secondaryOffset+binHeaderSize]
	if !allZero(head[:binHeaderSize]) || !bytes.Equal(sec[:6], secondaryMagic) {
		return probe{}, false, nil
	}
	h := parseBinHeader(sec)
	if h.version != 2 || h.hdrSize != hdrSize || h.hdrOffset != secondaryOffset ||
		!fixedField(sec[offLabel:offLabel+48], HeaderLabel) || !protocol.ValidDiskUUID(h.uuid) {
		return foreign(head, "a secondary LUKS2 header without a primary header"), true, nil
	}
	gap, err := d.read(recordOffset, 2*recordSlotSize)
	if err != nil {
		return probe{}, false, err
	}
	if !allZero(gap) {
		return foreign(head, "a secondary LUKS2 header without a primary header, on a disk that was in use"), true, nil
	}
	res, err := scanDevice(ctx, d, DataOffset)
	if err != nil {
		return probe{}, false, err
	}
	if !res.blank() {
		p := foreign(head, "an interrupted latchkey header install, over "+res.describe())
		p.uuid = h.uuid
		return p, true, nil
	}
	return probe{kind: kindInterrupted, uuid: h.uuid, head: head}, true, nil
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
