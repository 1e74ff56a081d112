package disk

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/latchkey/latchkey/internal/execx"
)

// kind is what classify found on the device.
type kind int

const (
	// kindBlank: first and last MiB all zeros, no signature anywhere.
	kindBlank kind = iota
	// kindOurs: a complete LUKS2 header of exactly latchkey's shape.
	kindOurs
	// kindInterrupted: latchkey's own header install was cut short before
	// its commit point (the primary binary header): the secondary header
	// is there, the primary is not, and no state record was ever written,
	// so nothing was ever unlocked or stored. Completing it loses nothing.
	kindInterrupted
	// kindForeign: anything else; never formatted unless WipeStateDisk.
	kindForeign
)

// probe is the outcome of classify.
type probe struct {
	kind kind
	uuid string // kindOurs, kindInterrupted
	head []byte // the first MiB as read (kindOurs: the validated copy)
	what string // kindForeign: what was found
	err  error  // kindForeign from a rejected LUKS2 header: why
}

// classify reads the device once and decides what it is. The order
// matters: LUKS magic first (so our own header is recognised without
// spawning blkid on every boot), then blkid's probes, then latchkey's own
// magic checks, and only a device with nothing anywhere is blank.
func (l *LUKS) classify(ctx context.Context, d *device) (probe, error) {
	head, err := d.read(0, blankCheckLength)
	if err != nil {
		return probe{}, err
	}
	if p, done := classifyLUKS(head); done {
		return p, nil
	}
	if p, done, err := l.classifyInterrupted(d, head); err != nil || done {
		return p, err
	}
	found, err := l.blkid(ctx, d.path)
	if err != nil {
		return probe{}, err
	}
	if found != "" {
		return foreign(head, found), nil
	}
	return l.classifyRest(d, head)
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
		return foreign(head, "a LUKS1 header"), true
	case 2:
		h, err := validateHeader(head, "")
		if err != nil {
			p := foreign(head, fmt.Sprintf("a LUKS2 header latchkey did not create or that was altered (%v)", err))
			p.err = err
			return p, true
		}
		return probe{kind: kindOurs, uuid: h.uuid, head: head}, true
	default:
		return foreign(head, fmt.Sprintf("a LUKS header of unknown version %d", v)), true
	}
}

// classifyInterrupted recognises latchkey's cut-short header install: no
// primary header at all (its 4 KiB are zero), a secondary binary header
// with latchkey's label and sizes, and an empty state-record gap.
func (l *LUKS) classifyInterrupted(d *device, head []byte) (probe, bool, error) {
	sec := head[secondaryOffset : secondaryOffset+binHeaderSize]
	if !allZero(head[:binHeaderSize]) || !bytes.Equal(sec[:6], secondaryMagic) {
		return probe{}, false, nil
	}
	h := parseBinHeader(sec)
	if h.version != 2 || h.hdrSize != hdrSize || h.hdrOffset != secondaryOffset ||
		!fixedField(sec[offLabel:offLabel+48], HeaderLabel) || !uuidPattern.MatchString(h.uuid) {
		return foreign(head, "a secondary LUKS2 header without a primary header"), true, nil
	}
	gap, err := d.read(recordOffset, 2*recordSlotSize)
	if err != nil {
		return probe{}, false, err
	}
	if !allZero(gap) {
		return foreign(head, "a secondary LUKS2 header without a primary header, on a disk that was in use"), true, nil
	}
	return probe{kind: kindInterrupted, uuid: h.uuid, head: head}, true, nil
}

// classifyRest names a known signature blkid missed, or decides between
// blank and unrecognised data.
func (l *LUKS) classifyRest(d *device, head []byte) (probe, error) {
	if what := knownMagic(head); what != "" {
		return foreign(head, what), nil
	}
	if off := firstNonZero(head); off >= 0 {
		return foreign(head, fmt.Sprintf("unrecognised non-zero data at byte %d (perhaps an encrypted volume or a format latchkey does not know)", off)), nil
	}
	tail, err := d.read(d.size-blankCheckLength, blankCheckLength)
	if err != nil {
		return probe{}, err
	}
	if off := firstNonZero(tail); off >= 0 {
		return foreign(head, fmt.Sprintf("unrecognised non-zero data at byte %d", d.size-blankCheckLength+int64(off))), nil
	}
	return probe{kind: kindBlank, head: head}, nil
}

// blkid asks libblkid's low-level probes (the same detection udev and
// wipefs use) what the device holds; "" means nothing.
func (l *LUKS) blkid(ctx context.Context, path string) (string, error) {
	fields, err := l.blkidFields(ctx, path)
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

// blkidFields runs `blkid -p -o export` and returns its KEY=value lines.
// Exit status 2 is blkid's "nothing found".
func (l *LUKS) blkidFields(ctx context.Context, path string) (map[string]string, error) {
	res, err := l.cfg.Runner.Run(ctx, execx.Cmd{Name: "blkid", Args: []string{"-p", "-o", "export", path}})
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

// magic is one signature latchkey checks itself, as a second opinion to
// blkid and to name what it finds.
type magic struct {
	off  int
	sig  string
	what string
}

var magics = []magic{
	{1080, "\x53\xef", "an ext2/3/4 file system"},
	{0, "XFSB", "an xfs file system"},
	{512, "EFI PART", "a GPT partition table"},
	{4096, "EFI PART", "a GPT partition table (4 KiB sectors)"},
	{512, "LABELONE", "an LVM physical volume"},
	{0, "LABELONE", "an LVM physical volume"},
	{4086, "SWAPSPACE2", "a swap area"},
	{65600, "_BHRfS_M", "a btrfs file system"},
	{32769, "CD001", "an ISO 9660 image"},
	{510, "\x55\xaa", "an MBR partition table or boot sector"},
}

func knownMagic(head []byte) string {
	for _, m := range magics {
		if m.off+len(m.sig) <= len(head) && string(head[m.off:m.off+len(m.sig)]) == m.sig {
			return m.what
		}
	}
	return ""
}
