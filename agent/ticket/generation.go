package ticket

import (
	"fmt"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// checkGenerations checks a ticket's master-secret generations against
// what the Hello named (docs/operations.md, "Rotating the master
// secret"): a disk on the current generation gets no previous key; a disk
// on an older one must get that generation's key, of the right size, or
// the agent could neither unlock nor rewrap it. A ticket that fails is
// dropped (its keys cleared): nothing is written with a key whose
// generation is not the one asked for.
func checkGenerations(req Request, t *latchkeyv1.Ticket) error {
	err := generationMismatch(req, t)
	if err != nil {
		clear(t.GetDiskKey())
		clear(t.GetPreviousDiskKey())
	}
	return err
}

func generationMismatch(req Request, t *latchkeyv1.Ticket) error {
	prev := t.GetPreviousDiskKey()
	switch {
	case req.DiskKeyGeneration == nil || *req.DiskKeyGeneration == t.GetKeyGeneration():
		if len(prev) != 0 {
			return fmt.Errorf("the ticket carries a previous-generation key (generation %d) the agent did not ask for", t.GetPreviousKeyGeneration())
		}
	case len(prev) == 0:
		return fmt.Errorf("the disk is keyed under master-secret generation %d and the ticket's key is generation %d, with no key for %d",
			*req.DiskKeyGeneration, t.GetKeyGeneration(), *req.DiskKeyGeneration)
	case t.GetPreviousKeyGeneration() != *req.DiskKeyGeneration:
		return fmt.Errorf("the ticket's previous key is generation %d, the disk's header names %d", t.GetPreviousKeyGeneration(), *req.DiskKeyGeneration)
	case len(prev) != diskKeySize:
		return fmt.Errorf("ticket previous disk key is %d bytes, want %d", len(prev), diskKeySize)
	}
	return nil
}
