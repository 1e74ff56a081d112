package disk

import (
	"github.com/latchkey/latchkey/agent/disk/luks2"

	"context"
	"errors"
	"fmt"
	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/internal/logkey"
)

// The offline token (docs/offline-unlock.md). A node whose verifier allows
// offline unlock keeps a TPM-sealed copy of its disk key and the current
// grant in one LUKS2 token of type "latchkey-offline", token id 0:
//
//	"tokens":{"0":{"type":"latchkey-offline","keyslots":[],
//	                "sealed":"<base64>","grant":"<base64>"}}
//
// sealed is the offline.Sealed encoding (checked with its
// UnmarshalBinary), grant the OfflineGrant's
// deterministic protobuf encoding. The validator (checkShape) accepts no
// token or exactly this one: exactly these keys, the type, an empty
// keyslot list (the token opens no keyslot by itself: the TPM releases
// the key, which then opens keyslot 0 like a ticket's), both values
// strict base64 within their size bounds, and a grant that decodes with
// no unknown field and re-encodes to the same bytes. Everything else in
// the header is held to exactly the shape it had before.
//
// It is not a systemd-tpm2 token: systemd-cryptsetup cannot evaluate a
// PolicyAuthorize + PolicyNV policy of this shape, and
// `systemd-cryptenroll --wipe-slot=tpm2` would wipe keyslot 0, latchkey's
// only keyslot.
//
// The token is written with the header-writing code the rewrap uses: both
// copies rebuilt in memory with seqid + 1, validated, then the primary
// written and synced, then the secondary. A crash between the two leaves
// copies that differ only in their tokens, the primary one seqid ahead:
// the validator accepts that one state (tokenTransition) and takes the
// primary's token, the one the agent meant to write; the next token write
// makes both copies equal again. The token is not trusted for anything
// but where to find the sealed object: the TPM decides whether it opens.

// Steps of an offline token write (LUKSConfig.FaultHook).
const (
	// StepOfflinePrimaryWritten: the primary copy carries the new token
	// state, the secondary the old one.
	StepOfflinePrimaryWritten Step = "offline-primary-written"
	// StepOfflineSecondaryWritten: both copies carry it.
	StepOfflineSecondaryWritten Step = "offline-secondary-written"
)

// StoreOffline writes tok as the disk's offline token, replacing any;
// RemoveOffline erases it. uuid is the disk's LUKS UUID (the header must
// still be latchkey's for it). Both hold the disk's exclusive lock, read
// and validate the header again, and check the rebuilt header validates
// and carries exactly the new token before writing anything.
func (l *LUKS) StoreOffline(ctx context.Context, uuid string, tok *OfflineToken) error {
	if tok == nil {
		return errors.New("store offline token: no token")
	}
	return l.writeOffline(ctx, uuid, tok)
}

// RemoveOffline erases the disk's offline token; a disk without one is
// left as it is.
func (l *LUKS) RemoveOffline(ctx context.Context, uuid string) error {
	return l.writeOffline(ctx, uuid, nil)
}

func (l *LUKS) writeOffline(ctx context.Context, uuid string, tok *OfflineToken) error {
	path, err := l.waitForDevice(ctx)
	if err != nil {
		return err
	}
	d, err := openDevice(path, readWrite)
	if err != nil {
		return err
	}
	defer d.Close()
	lock, err := l.lockDisk(ctx, d, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer lock.unlock()
	head, err := d.read(0, luks2.HeadAndKeyslot)
	if err != nil {
		return err
	}
	h, err := luks2.Validate(head, uuid)
	if err != nil {
		return fmt.Errorf("offline token: %w", err)
	}
	primary, second, err := luks2.BuildOffline(head, h, tok)
	if err != nil || primary == nil {
		return err
	}
	if err := l.writeInOrder(d, []orderedWrite{
		{primary, 0, StepOfflinePrimaryWritten},
		{second, luks2.SecondaryOffset, StepOfflineSecondaryWritten},
	}); err != nil {
		return err
	}
	l.cfg.Logger.Info("state disk: offline token written", slog.String(logkey.DiskUUID, uuid), slog.Bool(logkey.OfflineHeld, tok != nil))
	return nil
}
