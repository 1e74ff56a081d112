package disk

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/latchkey/latchkey/internal/logkey"
	"log/slog"
	"os"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"github.com/latchkey/latchkey/protocol"
)

// The rewrap (docs/operations.md, "Rotating the master secret"). When the
// validated header names an older master-secret generation than the
// ticket's key, the agent re-keys keyslot 0 to the current generation at
// boot. The volume key never changes, so the data segment and the digest
// stay as they are; only keyslot 0's KDF salt, its area (alternating
// between luks2.AreaA and luks2.AreaB) and the subsystem generation change, and the
// header keeps exactly latchkey's shape. Everything is built and checked
// in memory first (validated like a header read from a disk, unsealed
// with luks.go under the current key), then written in this order, each
// write followed by an fsync:
//
//  1. unlock with the older generation's key (in memory, from the
//     validated header);
//  2. the keyslot encrypted under the current key, into the area the
//     header does not reference: a crash leaves the old header, which
//     the next boot unlocks as before and starts over;
//  3. the primary header copy (seqid + 1, keyslot 0 in the other area,
//     new salt, subsystem latchkey-g<current>): a crash leaves the one
//     transitional state the validator accepts (checkTransition); the
//     next boot asks for both generations, opens whichever copy its keys
//     verify, and finishes;
//  4. the secondary copy: both copies are the new header;
//  5. the old area, zeroed: only now can the old generation's key no
//     longer open the disk;
//  6. the volume is opened from the new in-memory header.
//
// A crash after any write leaves a state from which the next boot ends on
// the current generation with nothing lost: the volume key, and so every
// byte of data, is untouched throughout.

// Steps of a rewrap (LUKSConfig.FaultHook), after each write and fsync.
const (
	// StepRewrapKeyslotWritten: the new keyslot is in the unreferenced
	// area; the header is the old one.
	StepRewrapKeyslotWritten Step = "rewrap-keyslot-written"
	// StepRewrapPrimaryWritten: the primary copy is the new header, the
	// secondary the old one (the transitional state).
	StepRewrapPrimaryWritten Step = "rewrap-primary-written"
	// StepRewrapSecondaryWritten: both copies are the new header; the
	// old area still holds the old keyslot.
	StepRewrapSecondaryWritten Step = "rewrap-secondary-written"
	// StepRewrapOldAreaZeroed: the old keyslot is gone.
	StepRewrapOldAreaZeroed Step = "rewrap-old-area-zeroed"
)

func (k Keys) check() error {
	if len(k.Current) != protocol.DiskKeySize {
		return fmt.Errorf("luks disk stage: ticket key is %d bytes, want %d", len(k.Current), protocol.DiskKeySize)
	}
	if len(k.Previous) != 0 && len(k.Previous) != protocol.DiskKeySize {
		return fmt.Errorf("luks disk stage: ticket previous key is %d bytes, want %d", len(k.Previous), protocol.DiskKeySize)
	}
	if k.Generation > luks2.MaxKeyGeneration {
		return fmt.Errorf("luks disk stage: ticket key generation %d is over %d", k.Generation, luks2.MaxKeyGeneration)
	}
	return nil
}

// keyFor returns the ticket's key of generation gen, or nil.
func (k Keys) keyFor(gen uint32) []byte {
	switch {
	case gen == k.Generation:
		return k.Current
	case len(k.Previous) > 0 && gen == k.PreviousGeneration:
		return k.Previous
	}
	return nil
}

// candidates are the ticket's keys to try on a copy naming gen: its own
// generation's first.
func (k Keys) candidates(gen uint32) [][]byte {
	var out [][]byte
	own := k.keyFor(gen)
	if own != nil {
		out = append(out, own)
	}
	for _, key := range [][]byte{k.Current, k.Previous} {
		if len(key) > 0 && !bytes.Equal(key, own) {
			out = append(out, key)
		}
	}
	return out
}

// planGeneration is the generation a Hello for this header names: the
// header's, or in the transitional state the older copy's, so the ticket
// carries a key for each copy.
func planGeneration(h *luks2.Header) *uint32 {
	g := h.Generation
	if h.Prior != nil {
		g = h.Prior.Generation
	}
	return &g
}

// settleGeneration makes the validated header in p end on keys.Generation,
// rewrapping when it names another generation or is transitional, and
// returns the probe to unseal from (its head the new header, in memory).
// A transitional header whose primary copy a ticket key opens is first
// finished (steps 4 and 5 toward the primary's generation), then, if
// that is not the current generation, rewrapped like any other. The
// caller holds the disk's exclusive lock; d is open read-write.
func (l *LUKS) settleGeneration(d *device, p probe, keys Keys) (probe, error) {
	head := p.head
	for pass := 0; ; pass++ {
		h, err := luks2.Validate(head, p.uuid)
		if err != nil {
			return p, err
		}
		if h.Prior == nil && h.Generation == keys.Generation {
			p.head = head
			return p, l.zeroUnreferenced(d, p.uuid, head, h)
		}
		if pass == 2 { // finish, then rewrap: never more
			return p, fmt.Errorf("rewrap state disk %s: still on generation %d after two passes", p.uuid, h.Generation)
		}
		w, err := planRewrap(head, h, keys)
		if err != nil {
			return p, fmt.Errorf("rewrap state disk %s: %w", p.uuid, err)
		}
		p.rewrapped = true
		if err := l.writeRewrap(d, w); err != nil {
			return p, err
		}
		l.cfg.Logger.Info("state disk: keyslot rewrapped", slog.String(logkey.DiskUUID, p.uuid),
			slog.Uint64(logkey.FromGeneration, uint64(w.from)), slog.Uint64(logkey.KeyGeneration, uint64(w.to)),
			slog.Bool(logkey.FinishedInterrupted, w.finishing))
		head = w.head
	}
}

// planRewrap unlocks the copy of h a ticket key opens (step 1) and builds
// the next header in memory.
func planRewrap(head []byte, h *luks2.Header, keys Keys) (*rewrapWrite, error) {
	copies := []luks2.Copy{{SeqID: h.SeqID, JSON: h.JSON, Generation: h.Generation, Area: h.Area}}
	if h.Prior != nil {
		copies = append(copies, *h.Prior)
	}
	idx, vk, key, err := unlockCopy(head, copies, keys)
	if err != nil {
		return nil, err
	}
	defer clear(vk)
	if h.Prior != nil && idx == 0 {
		return buildFinish(head, copies[0], key)
	}
	return buildRewrap(head, copies[idx], vk, keys)
}

// unlockCopy returns the index of the copy a ticket key opens, with the
// volume key and the key that opened it. Each copy is tried with the key of the generation it names
// first, then with the ticket's other keys: an agent that predates
// generations formatted its disk with whatever key the verifier sent but
// left the subsystem empty (generation 0), and such a header, opened by
// the current key, is rewrapped to name the generation it is really
// under. Only the digest decides which key is right.
func unlockCopy(head []byte, copies []luks2.Copy, keys Keys) (int, []byte, []byte, error) {
	var gens []uint32
	for i, c := range copies {
		gens = append(gens, c.Generation)
		sp, err := luks2.SlotParamsOf(c.JSON)
		if err != nil {
			return 0, nil, nil, err
		}
		for _, key := range keys.candidates(c.Generation) {
			vk, err := luks2.UnwrapVolumeKey(head[c.Area:c.Area+luks2.KeyslotAreaSize], key, sp)
			if errors.Is(err, luks2.ErrWrongKey) {
				continue
			}
			if err != nil {
				return 0, nil, nil, err
			}
			return i, vk, key, nil
		}
	}
	have := fmt.Sprintf("generation %d", keys.Generation)
	if len(keys.Previous) > 0 {
		have += fmt.Sprintf(" and %d", keys.PreviousGeneration)
	}
	return 0, nil, nil, fmt.Errorf("the header is keyed under master-secret generation %v and the ticket's keys (%s) do not open it", gens, have)
}

// rewrapWrite is a rewrap built in memory: what goes where, in order.
type rewrapWrite struct {
	keyslot         []byte // the new keyslot (nil when finishing)
	keyslotAt       int64
	primary, second []byte
	oldArea         int64
	head            []byte // the new header as it will be on the device
	finishing       bool
	from, to        uint32
}

// buildRewrap builds the new header from base (the copy the ticket's key
// opened): the volume key under the current key with a new salt into the
// other area, both copies with seqid + 1 and the current generation, and
// base's area zeroed.
func buildRewrap(head []byte, base luks2.Copy, vk []byte, keys Keys) (*rewrapWrite, error) {
	sp, err := luks2.SlotParamsOf(base.JSON)
	if err != nil {
		return nil, err
	}
	salt := make([]byte, luks2.SaltBytes)
	rand.Read(salt)
	target := luks2.OtherArea(base.Area)
	js, err := luks2.WithSlot(base.JSON, sp, target, salt)
	if err != nil {
		return nil, err
	}
	w := &rewrapWrite{keyslotAt: target, oldArea: base.Area, from: base.Generation, to: keys.Generation}
	if w.keyslot, err = luks2.WrapVolumeKey(vk, keys.Current, salt); err != nil {
		return nil, err
	}
	seq := base.SeqID + 1
	w.primary = luks2.EncodeCopy(head[:luks2.HeaderSize], seq, keys.Generation, js)
	w.second = luks2.EncodeCopy(head[luks2.SecondaryOffset:luks2.SecondaryOffset+luks2.HeaderSize], seq, keys.Generation, js)
	return w, w.check(head, keys.Current)
}

// buildFinish completes a transitional header whose primary copy opens:
// the secondary becomes the primary's twin and the older area is zeroed.
func buildFinish(head []byte, primary luks2.Copy, key []byte) (*rewrapWrite, error) {
	w := &rewrapWrite{finishing: true, oldArea: luks2.OtherArea(primary.Area), from: primary.Generation, to: primary.Generation}
	w.primary = bytes.Clone(head[:luks2.HeaderSize])
	w.second = luks2.EncodeCopy(head[luks2.SecondaryOffset:luks2.SecondaryOffset+luks2.HeaderSize], primary.SeqID, primary.Generation, primary.JSON)
	return w, w.check(head, key)
}

// check assembles w.head and proves it before anything is written: it
// must validate as an ordinary (not transitional) header of generation
// w.to with keyslot 0 in the area not zeroed, and luks.go must unseal it
// with key.
func (w *rewrapWrite) check(head []byte, key []byte) error {
	w.head = bytes.Clone(head[:luks2.HeadAndKeyslot])
	if w.keyslot != nil {
		copy(w.head[w.keyslotAt:], w.keyslot)
	}
	copy(w.head[0:], w.primary)
	copy(w.head[luks2.SecondaryOffset:], w.second)
	clear(w.head[w.oldArea : w.oldArea+luks2.KeyslotAreaSize])
	h, err := luks2.Validate(w.head, "")
	if err != nil {
		return fmt.Errorf("the rewrapped header does not validate: %w", err)
	}
	if h.Prior != nil || h.Generation != w.to || h.Area != luks2.OtherArea(w.oldArea) {
		return fmt.Errorf("the rewrapped header names generation %d, area %d; want %d, %d", h.Generation, h.Area, w.to, luks2.OtherArea(w.oldArea))
	}
	if _, err := unsealDetached(w.head, key, "", luks2.DataOffset+mib); err != nil {
		return fmt.Errorf("the rewrapped header does not open with its key: %w", err)
	}
	return nil
}

// writeRewrap writes w in the documented order (steps 2 to 5), each write
// followed by an fsync and the step's fault point.
func (l *LUKS) writeRewrap(d *device, w *rewrapWrite) error {
	steps := []orderedWrite{
		{w.keyslot, w.keyslotAt, StepRewrapKeyslotWritten},
		{w.primary, 0, StepRewrapPrimaryWritten},
		{w.second, luks2.SecondaryOffset, StepRewrapSecondaryWritten},
		{make([]byte, luks2.KeyslotAreaSize), w.oldArea, StepRewrapOldAreaZeroed},
	}
	if w.finishing {
		steps = steps[2:]
	}
	return l.writeInOrder(d, steps)
}

// orderedWrite is one write of a header change whose order is its crash
// safety: data at at, then the fault point step.
type orderedWrite struct {
	data []byte
	at   int64
	step Step
}

// writeInOrder makes each write durable (write, fsync) before the next,
// passing each step's fault point, so a crash leaves exactly one of the
// states the header validator accepts.
func (l *LUKS) writeInOrder(d *device, steps []orderedWrite) error {
	for _, s := range steps {
		if err := d.write(s.data, s.at); err != nil {
			return err
		}
		if err := d.sync(); err != nil {
			return err
		}
		if err := l.fault(s.step); err != nil {
			return err
		}
	}
	return nil
}

// stampGeneration is luks2.StampGeneration on a formatted memory image; it
// also zeroes area B (luksFormat fills it with random bytes), so on every
// disk latchkey formats the area keyslot 0 does not use is all zeros
// except while a rewrap is in flight.
func stampGeneration(img *os.File, gen uint32) error {
	head := make([]byte, luks2.KeyslotsOffset)
	if _, err := img.ReadAt(head, 0); err != nil {
		return fmt.Errorf("read header image: %w", err)
	}
	luks2.StampGeneration(head, gen)
	if _, err := img.WriteAt(head, 0); err != nil {
		return fmt.Errorf("write header image: %w", err)
	}
	if _, err := img.WriteAt(make([]byte, luks2.KeyslotAreaSize), luks2.AreaB); err != nil {
		return fmt.Errorf("write header image: %w", err)
	}
	return nil
}

// zeroUnreferenced is step 5 on its own: a header on the ticket's
// generation whose unreferenced area is not all zeros is a rewrap killed
// after its secondary write (the old keyslot is still there, and with the
// old secret it would open the disk), a rewrap killed after its keyslot
// write that the verifier no longer wants, or a disk formatted before
// generations existed (luksFormat's random fill). The area is zeroed
// (and synced) in each case; it is never referenced by the header, so
// nothing is lost.
func (l *LUKS) zeroUnreferenced(d *device, uuid string, head []byte, h *luks2.Header) error {
	other := luks2.OtherArea(h.Area)
	if allZero(head[other : other+luks2.KeyslotAreaSize]) {
		return nil
	}
	if err := d.write(make([]byte, luks2.KeyslotAreaSize), other); err != nil {
		return err
	}
	if err := d.sync(); err != nil {
		return err
	}
	clear(head[other : other+luks2.KeyslotAreaSize])
	l.cfg.Logger.Info("state disk: zeroed the keyslot area the header does not use", slog.String(logkey.DiskUUID, uuid),
		slog.Uint64(logkey.KeyGeneration, uint64(h.Generation)))
	return l.fault(StepRewrapOldAreaZeroed)
}
