// Package disk is the agent's state-disk stage. Before attestation it
// decides which LUKS UUID the node asks a key for and whether this is a
// rejoin (Prepare); after the ticket arrives it formats or unlocks the disk
// with the ticket's key and mounts it (Open).
//
// The stage produces the disk specified or no disk at all: an existing LUKS
// volume is reused, anything unexpected is an error, and nothing that
// carries data is ever formatted unless the operator said so explicitly.
package disk

import (
	"context"
	"fmt"
)

// KeySize is the length of the disk key in a ticket (256 random bits).
const KeySize = 32

// Plan is what Prepare found: the UUID to ask the key for and whether the
// disk already carries this node's LUKS header.
type Plan struct {
	UUID   string
	Rejoin bool
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
	if len(key) != KeySize {
		return Result{}, fmt.Errorf("key-only disk stage: ticket key is %d bytes, want %d", len(key), KeySize)
	}
	return Result{}, nil
}
