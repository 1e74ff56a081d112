package disk

import "github.com/latchkey/latchkey/agent/disk/luks2"

// The state device's layout is luks2's (luks2/layout.go); these are the
// stage's own sizes around it.
const (
	// FSLabel is the label of the file system inside (xfs allows 12 bytes).
	FSLabel = "latchkey"

	mib           = 1 << 20
	minDeviceSize = luks2.DataOffset + 16*mib
	imageSize     = luks2.DataOffset + mib // the in-memory format target
	// blankCheckLength is what classify reads first: the headers, the
	// keyslots area and more.
	blankCheckLength = mib
)

// Step names a point of Open where a crash leaves a distinct on-disk
// state. LUKSConfig.FaultHook is called at each (tests use it to "kill"
// the agent there and check the next run finishes the job).
type Step string

// The steps, in the order a first boot passes them.
const (
	// StepFormatted: header and keyslot built in memory and checked; the
	// device is untouched.
	StepFormatted Step = "formatted"
	// StepHeaderPartial: secondary header, primary JSON and keyslots are
	// on the device, the primary binary header (the commit point) is not.
	StepHeaderPartial Step = "header-partial"
	// StepHeaderWritten: the complete header is on the device.
	StepHeaderWritten Step = "header-written"
	// StepMapped: the dm-crypt mapping exists.
	StepMapped Step = "mapped"
	// StepMkfsStarted: the state record says "mkfs"; no file system yet.
	StepMkfsStarted Step = "mkfs-started"
	// StepFileSystemMade: mkfs finished; the record still says "mkfs".
	StepFileSystemMade Step = "filesystem-made"
	// StepFileSystemReady: the record says "ready".
	StepFileSystemReady Step = "filesystem-ready"
	// StepMounted: the state file system is mounted.
	StepMounted Step = "mounted"
	// StepBound: the bind mounts are in place.
	StepBound Step = "bound"
)
