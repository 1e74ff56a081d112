package binding

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/latchkey/latchkey/internal/kubekey"
	coordinationv1 "k8s.io/api/coordination/v1"
)

// Master-secret generations on disk records (docs/operations.md,
// "Rotating the master secret"). A disk record holds the generation the
// disk's last join named: the one its header was keyed under when the
// agent asked (a first boot records the current generation, which the
// agent writes into its new header). The record is conservative: after a
// rewrap it still names the old generation until the disk's next join,
// so `secret retire` never retires a generation a disk might still need.

// GenerationRecorder is implemented by the stores that record disks'
// master-secret generations (Dir and Leases).
type GenerationRecorder interface {
	// SetKeyGeneration records gen on the disk record bound to identity
	// (a *MismatchError when it holds another identity, ErrNotFound when
	// it is released or absent). Recording the generation already on
	// record writes nothing.
	SetKeyGeneration(ctx context.Context, disk, identity string, gen uint32) error
}

var (
	_ GenerationRecorder = (*Dir)(nil)
	_ GenerationRecorder = (*Leases)(nil)
)

// MaxGeneration is the largest master-secret generation a record holds;
// it matches keys.MaxGeneration (binding does not import the key
// package). Every store refuses a larger one on write (ErrInvalid) and
// on read (the record is invalid), so a number a Hello named can never
// make a record that some store, or some replica, cannot read back.
const MaxGeneration = 1<<31 - 1

// checkGeneration refuses a generation out of range.
func checkGeneration(gen uint32) error {
	if gen > MaxGeneration {
		return fmt.Errorf("%w: key generation %d is over %d", ErrInvalid, gen, MaxGeneration)
	}
	return nil
}

func parseGeneration(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > MaxGeneration || strconv.FormatUint(n, 10) != s {
		return 0, errors.New("not a generation number")
	}
	return uint32(n), nil
}

// SetKeyGeneration implements GenerationRecorder.
func (d *Dir) SetKeyGeneration(_ context.Context, disk, identity string, gen uint32) error {
	change, err := setGeneration(disk, identity, gen)
	if err != nil {
		return err
	}
	return d.update(Disk, disk, change)
}

// setGeneration is SetKeyGeneration's change to a bound disk record, for
// the stores that keep Records (Dir, Etcd): the record must be bound to
// identity, and an unchanged generation stores nothing.
func setGeneration(disk, identity string, gen uint32) (func(Record) (*Record, error), error) {
	if err := validate(Disk, disk, identity, true); err != nil {
		return nil, err
	}
	if err := checkGeneration(gen); err != nil {
		return nil, err
	}
	return func(r Record) (*Record, error) {
		if !r.Bound() {
			return nil, fmt.Errorf("%w: disk %s was released", ErrNotFound, disk)
		}
		if err := Check(r, identity); err != nil {
			return nil, err
		}
		if r.KeyGeneration != nil && *r.KeyGeneration == gen {
			return nil, nil
		}
		r.KeyGeneration = &gen
		return &r, nil
	}, nil
}

// SetKeyGeneration implements GenerationRecorder, with the optimistic,
// identity-checked update of every bound-record change.
func (l *Leases) SetKeyGeneration(ctx context.Context, disk, identity string, gen uint32) error {
	if err := validate(Disk, disk, identity, true); err != nil {
		return err
	}
	if err := checkGeneration(gen); err != nil {
		return err
	}
	want := strconv.FormatUint(uint64(gen), 10)
	return l.updateBound(ctx, Disk, disk, identity, func(lease *coordinationv1.Lease) bool {
		if lease.Annotations[kubekey.AnnotationKeyGeneration] == want {
			return false
		}
		lease.Annotations[kubekey.AnnotationKeyGeneration] = want
		return true
	})
}

// GenerationUnknown is how a disk with no recorded generation is counted.
const GenerationUnknown = "unknown"

// CountByGeneration counts the disk records by generation (decimal, or
// GenerationUnknown). Released records count too: the disk may still
// exist and need its generation.
func CountByGeneration(records []Record) map[string]int {
	out := map[string]int{}
	for _, r := range records {
		if r.Kind != Disk {
			continue
		}
		out[generationLabel(r)]++
	}
	return out
}

func generationLabel(r Record) string {
	if r.KeyGeneration == nil {
		return GenerationUnknown
	}
	return strconv.FormatUint(uint64(*r.KeyGeneration), 10)
}

// RetireBlockers returns the disk records that keep generation gen from
// being retired: those that name it and those with no recorded
// generation (a disk from before generations were recorded may be keyed
// under any), sorted by disk UUID. Released records count: the disk may
// still exist. `latchkey-verifier secret retire` refuses while any
// remains.
func RetireBlockers(records []Record, gen uint32) []Record {
	var out []Record
	for _, r := range records {
		if r.Kind == Disk && (r.KeyGeneration == nil || *r.KeyGeneration == gen) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Record) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// GenerationClaimer is implemented by the stores that can record a
// disk's generation in the claim itself (Dir and Leases), saving a first
// join the read and write of a separate SetKeyGeneration.
type GenerationClaimer interface {
	// ClaimGeneration is Claim for a disk that also records gen on the
	// record it creates or takes over; a record already bound to identity
	// is returned unchanged (the caller records gen separately then).
	ClaimGeneration(ctx context.Context, disk, identity string, gen uint32) (rec Record, recorded bool, err error)
}

var (
	_ GenerationClaimer = (*Dir)(nil)
	_ GenerationClaimer = (*Leases)(nil)
)

// ClaimGeneration implements GenerationClaimer.
func (d *Dir) ClaimGeneration(_ context.Context, disk, identity string, gen uint32) (Record, bool, error) {
	if err := checkGeneration(gen); err != nil {
		return Record{}, false, err
	}
	return d.claim(Disk, disk, identity, &gen)
}

// ClaimGeneration implements GenerationClaimer.
func (l *Leases) ClaimGeneration(ctx context.Context, disk, identity string, gen uint32) (Record, bool, error) {
	if err := checkGeneration(gen); err != nil {
		return Record{}, false, err
	}
	return l.claim(ctx, Disk, disk, identity, &gen)
}
