// Package disk is the agent's state-disk stage. Before attestation it
// decides which LUKS UUID the node asks a key for and whether this is a
// rejoin (Prepare); after the ticket arrives it formats or unlocks the disk
// with the ticket's key and mounts it (Open).
//
// The stage produces the disk specified or no disk at all: an existing LUKS
// volume is reused, anything unexpected is an error, and nothing that
// carries data is ever formatted unless the operator said so explicitly.
//
// # The LUKS stage
//
// NewLUKS builds the real stage. Prepare first refuses a device that is
// missing, read-only (BLKROGET) or too small for the file system, before
// any ticket is fetched, and so is a kernel without device-mapper. It
// then classifies the device: latchkey's own LUKS2 header (a rejoin with
// its UUID), a blank device (fullcheck.go: every byte read and zero; or,
// with BlankCheck "sampled", scan.go's sampled rule: a fresh random
// UUID), latchkey's own interrupted header install, proved byte for byte
// (its UUID, installed again), or anything else, which is refused with a
// message naming what was found and at which byte (a file system, a
// partition table, LVM, md, LUKS1, a LUKS2 header of another shape,
// unrecognised data) unless WipeStateDisk names this very disk (wipe.go).
// An altered header latchkey created is refused with what changed and
// the recovery path. Prepare never writes, so a ticket that never arrives
// leaves the disk as it was.
//
// One agent per disk. Open holds an exclusive flock on the whole disk
// (lock.go) and classifies again from the locked descriptor, so a second
// agent finds the first one's header and stops instead of rewriting it.
// A first boot's Prepare keeps its shared lock until Open converts it,
// so the device is read in full once, not twice.
//
// Header validation. Before every unlock the header is read from the
// device and must be exactly the shape latchkey's luksFormat writes: both
// binary headers with the fixed sizes, offsets, label and sha256 checksum,
// identical JSON in both copies, and JSON that equals, key for key, one
// aes-xts-plain64 crypt segment at 16 MiB with 4 KiB sectors, one luks2
// keyslot with a 512-bit key and pbkdf2-sha256 at 1000 iterations, one
// pbkdf2 digest, no token but the latchkey-offline one (offline.go), no
// flags, no requirements; keyslot 0's area
// is area A or B and the subsystem field names the master-secret
// generation (none, or latchkey-g<n>). The copies must be identical,
// except in the one transitional state a rewrap cut short between its
// two header writes leaves (generation.go). The JSON is
// compared as a tree parsed token by token, so duplicate keys, case
// variants and trailing documents, which encoding/json (and so luks.go)
// would silently accept, are refused. A cipher_null segment, another
// cipher or key size, an added keyslot, a moved segment and any edited
// JSON are refused with the path and value that differ.
//
// Detached header. luks.go unseals from an anonymous memory copy of the
// header bytes that were validated, and the dm-crypt table points at the
// major:minor of the descriptor they were read from. Nothing is read from
// the disk twice, so a host cannot swap the header between validation and
// unlock.
//
// Formatting. cryptsetup luksFormat (LUKS2, aes-xts-plain64, 512-bit key,
// 4096-byte sectors, pbkdf2 at 1000 iterations, key on stdin) writes to a
// memory file, never the device; the result is validated and unsealed
// once, then copied to the device so that the primary binary header, one
// 4 KiB write, is the commit point. A kill before it leaves a state
// Prepare recognises and redoes; after it the header is never rewritten.
//
// File system. A state record in the unused gap before the data segment
// says whether mkfs is in progress or finished, so an interrupted mkfs is
// redone while a finished file system that later went missing is refused,
// never remade (unless WipeStateDisk names the disk).
//
// Rewrap. A header on an older master-secret generation than the
// ticket's key is re-keyed at boot, in memory first, then written in an
// order where a crash after any write leaves a state the next boot
// finishes, with the volume key (so the data) untouched (rewrap.go).
//
// Keys. The ticket's key reaches cryptsetup on a pipe and luks.go in
// memory; it is never in an argument list, a file or a log. The volume key
// lives in luks.go's Volume (unexported, not clearable) only until the
// mapping exists.
//
// Every external command runs through internal/execx; device-mapper and
// mount(2) sit behind the Kernel interface, so everything up to the
// mapping is tested with real cryptsetup on loop devices on hosts without
// device-mapper. See docs/disk.md.
package disk

import (
	"context"
	"fmt"

	"github.com/latchkey/latchkey/protocol"
)

// Plan is what Prepare found: the UUID to ask the key for and whether the
// disk already carries this node's LUKS header.
type Plan struct {
	UUID   string
	Rejoin bool
	// KeyGeneration is the master-secret generation the validated header
	// names (rewrap.go), for the Hello; nil on a first boot.
	KeyGeneration *uint32
	// Offline is the validated header's offline token (offline.go); nil
	// when it holds none.
	Offline *OfflineToken
}

// Result is what Open produced.
type Result struct {
	// MountPoint is where the opened state disk is mounted ("" when the
	// stage mounts nothing).
	MountPoint string
	// HasKubeletCredentials tells the join stage the node already joined,
	// so a reboot does not run kubeadm join again.
	HasKubeletCredentials bool
	// Device is the opened (decrypted) volume, UUID the LUKS UUID and
	// FSType its file system ("" when the stage opens nothing).
	Device, UUID, FSType string
	// Formatted says this run wrote the LUKS header; MadeFileSystem that
	// it made the file system (both false on an ordinary reboot).
	Formatted, MadeFileSystem bool
	// KeyGeneration is the master-secret generation the disk is keyed
	// under once open (the ticket's key_generation).
	KeyGeneration uint32
}

// Stage is the disk stage of a boot.
type Stage interface {
	Prepare(ctx context.Context) (Plan, error)
	Open(ctx context.Context, plan Plan, key []byte) (Result, error)
}

// KeyOnly is the stage for disk-only demos and machines whose disk is
// handled elsewhere: it asks for the key of a fixed UUID, checks the key
// has the expected length, and touches no device. It never prints the key.
type KeyOnly struct {
	UUID   string
	Rejoin bool
}

// Prepare returns the configured UUID.
func (k KeyOnly) Prepare(context.Context) (Plan, error) {
	if k.UUID == "" {
		return Plan{}, fmt.Errorf("key-only disk stage: no disk UUID configured")
	}
	return Plan{UUID: k.UUID, Rejoin: k.Rejoin}, nil
}

// Open checks the key length and reports nothing mounted.
func (k KeyOnly) Open(_ context.Context, _ Plan, key []byte) (Result, error) {
	if len(key) != protocol.DiskKeySize {
		return Result{}, fmt.Errorf("key-only disk stage: ticket key is %d bytes, want %d", len(key), protocol.DiskKeySize)
	}
	return Result{}, nil
}
