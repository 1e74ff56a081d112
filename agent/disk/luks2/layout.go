package luks2

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
	// DataOffset is where the encrypted data segment starts.
	DataOffset = 16 << 20

	// BinHeaderSize is one binary header; HeaderSize one binary header
	// plus its JSON area (one header copy).
	BinHeaderSize = 4096
	HeaderSize    = 16384
	// SecondaryOffset is where the secondary header copy starts.
	SecondaryOffset = HeaderSize
	// JSONAreaSize is the JSON area of one copy.
	JSONAreaSize = HeaderSize - BinHeaderSize
	// KeyslotsOffset is the start of the keyslots area, after both copies.
	KeyslotsOffset = 2 * HeaderSize
	// KeyslotAreaSize is one keyslot's area: a 64-byte key times 4000 AF
	// stripes, 4 KiB aligned.
	KeyslotAreaSize = 258048
	// KeyslotsSize is the keyslots area: up to the gap at 15 MiB.
	KeyslotsSize = 15695872
	// RecordOffset and RecordSlotSize place the state record's two
	// slots in the gap (record.go).
	RecordOffset   = KeyslotsOffset + KeyslotsSize
	RecordSlotSize = 4096
	// SectorSize is the data segment's sector size.
	SectorSize = 4096
	// VolumeKeyBytes: aes-xts-plain64 with two 256-bit AES keys.
	VolumeKeyBytes = 64
	// KDFIterations is the pbkdf2 iteration count of the keyslot and
	// the digest.
	KDFIterations = 1000
	// AFStripes is the anti-forensic split's stripe count.
	AFStripes = 4000
	// SaltBytes is the length of the keyslot's and the digest's salts.
	SaltBytes = 32
	// Cipher and Hash are the only cipher and hash the header may name.
	Cipher = "aes-xts-plain64"
	Hash   = "sha256"
	// HeadAndKeyslot covers both header copies and both keyslot areas
	// a rewrap alternates between (generation.go): what Validate reads.
	HeadAndKeyslot = KeyslotsOffset + 2*KeyslotAreaSize
)
