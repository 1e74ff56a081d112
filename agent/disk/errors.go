package disk

import (
	"errors"

	"github.com/latchkey/latchkey/agent/disk/luks2"
)

// Sentinel errors, for errors.Is; the wrapping error says what was found.
var (
	// ErrForeignData: the device carries something latchkey did not
	// create (a file system, partition table, LVM, LUKS1, unrecognised
	// data), so it is not formatted unless WipeStateDisk names the disk.
	ErrForeignData = errors.New("state disk holds data latchkey did not create")
	// ErrHeaderRejected: a LUKS2 header is present but not exactly the
	// shape latchkey creates (altered or hostile); it is never unlocked.
	// It is the validator's own sentinel.
	ErrHeaderRejected = luks2.ErrRejected
	// ErrStateChanged: the device changed between Prepare and Open.
	ErrStateChanged = errors.New("state disk changed since Prepare")
	// ErrVolumeContent: the opened volume holds something other than the
	// file system latchkey made there, so it is not formatted.
	ErrVolumeContent = errors.New("state volume content refused")
	// ErrWipeMismatch: WipeStateDisk is set but names another disk, so
	// nothing is destroyed.
	ErrWipeMismatch = errors.New("wipeStateDisk names another disk")
	// ErrUnusable: the device cannot be used at all (read-only, too small
	// for the file system, no medium); found before any ticket is fetched.
	ErrUnusable = errors.New("state disk unusable")
	// ErrHeaderWritten: the LUKS2 header (or part of its install) was
	// written, then opening the disk failed. Unlike every other refusal,
	// the disk was changed: the next boot finds latchkey's header (or
	// its interrupted install) and goes on from there.
	ErrHeaderWritten = errors.New("the state disk's LUKS2 header was written, then opening it failed")
	// ErrNoDeviceMapper: the kernel has no device-mapper.
	ErrNoDeviceMapper = errors.New("kernel has no device-mapper")
)
