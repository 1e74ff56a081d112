package disk

// The on-disk layout latchkey creates, fixed so the header validator can
// demand exactly this shape and nothing else. Offsets are bytes from the
// start of the state device.
//
//	0        16 KiB  primary LUKS2 header (4 KiB binary + 12 KiB JSON)
//	16 KiB   32 KiB  secondary LUKS2 header
//	32 KiB   15 MiB  keyslots area (keyslot 0 in area A at its start or B
//	                 right after, generation.go; the rest random)
//	15 MiB   16 MiB  gap: latchkey's state record (two 4 KiB slots)
//	16 MiB   end     the encrypted data segment (4 KiB sectors)
const (
	// HeaderLabel is the LUKS2 label of every state disk latchkey formats.
	HeaderLabel = "latchkey-state"
	// FSLabel is the label of the file system inside (xfs allows 12 bytes).
	FSLabel = "latchkey"
	// DataOffset is where the encrypted data segment starts.
	DataOffset = 16 << 20

	mib             = 1 << 20
	binHeaderSize   = 4096
	hdrSize         = 16384 // one binary header plus its JSON area
	secondaryOffset = hdrSize
	jsonAreaSize    = hdrSize - binHeaderSize
	keyslotsOffset  = 2 * hdrSize
	keyslotAreaSize = 258048   // 64-byte key × 4000 AF stripes, 4 KiB aligned
	keyslotsSize    = 15695872 // keyslots area: up to the gap at 15 MiB
	recordOffset    = keyslotsOffset + keyslotsSize
	recordSlotSize  = 4096
	sectorSize      = 4096
	volumeKeyBytes  = 64 // aes-xts-plain64 with two 256-bit AES keys
	kdfIterations   = 1000
	afStripes       = 4000
	saltBytes       = 32
	luksCipher      = "aes-xts-plain64"
	luksHash        = "sha256"
	minDeviceSize   = DataOffset + 16*mib
	imageSize       = DataOffset + mib // the in-memory format target
	// headAndKeyslot: both header copies and both keyslot areas a
	// rewrap alternates between (generation.go).
	headAndKeyslot   = keyslotsOffset + 2*keyslotAreaSize
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
