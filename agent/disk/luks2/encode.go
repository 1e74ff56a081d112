package luks2

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
)

// FormatArgs is the cryptsetup luksFormat command line that makes exactly
// the header Validate accepts, formatting target (no secret: the key is
// read from stdin with --key-file -). Running it is the caller's.
func FormatArgs(uuid, target string) []string {
	return []string{
		"luksFormat", "--batch-mode", "--type", "luks2",
		"--cipher", Cipher, "--key-size", strconv.Itoa(VolumeKeyBytes * 8),
		"--sector-size", strconv.Itoa(SectorSize),
		"--uuid", uuid, "--label", HeaderLabel,
		"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", strconv.Itoa(KDFIterations), "--hash", Hash,
		"--luks2-metadata-size", strconv.Itoa(HeaderSize/1024) + "k",
		"--luks2-keyslots-size", strconv.Itoa(KeyslotsSize/1024) + "k",
		"--offset", strconv.Itoa(DataOffset / 512),
		"--key-file", "-", target,
	}
}

// EncodeCopy is one 16 KiB header copy: old's binary header (its magic,
// offset, label, salt and UUID) with seqid, subsystem and JSON replaced
// and the checksum recomputed.
func EncodeCopy(old []byte, seq uint64, gen uint32, js []byte) []byte {
	b := make([]byte, HeaderSize)
	copy(b, old[:BinHeaderSize])
	binary.BigEndian.PutUint64(b[OffSeqID:], seq)
	clear(b[OffSubsystem : OffSubsystem+48])
	copy(b[OffSubsystem:], SubsystemName(gen))
	copy(b[BinHeaderSize:], js)
	SetChecksum(b)
	return b
}

// SetChecksum recomputes the sha256 checksum of one 16 KiB header copy
// (the checksum field is zero while it is computed).
func SetChecksum(area []byte) {
	clear(area[OffCsum : OffCsum+64])
	sum := sha256.Sum256(area[:HeaderSize])
	copy(area[OffCsum:], sum[:])
}

// StampGeneration writes generation gen into both header copies of a
// freshly formatted image (the first boot writes the ticket's
// generation), with their checksums; generation 0 leaves the image as
// luksFormat made it.
func StampGeneration(head []byte, gen uint32) {
	if gen == 0 {
		return
	}
	for _, off := range []int{0, SecondaryOffset} {
		c := head[off : off+HeaderSize]
		js, _ := JSONArea(c[BinHeaderSize:])
		copy(c, EncodeCopy(c, binary.BigEndian.Uint64(c[OffSeqID:]), gen, js))
	}
}

// PromoteSecondary returns the first HeadAndKeyslot bytes of head with
// the secondary copy also written as the primary (its magic, offset and
// checksum made a primary's): what an interrupted install's keyslot is
// proved with, unsealed from memory (agent/disk's ownKeyslot).
func PromoteSecondary(head []byte) []byte {
	img := make([]byte, HeadAndKeyslot)
	copy(img, head[:HeadAndKeyslot])
	copy(img[:HeaderSize], head[SecondaryOffset:SecondaryOffset+HeaderSize])
	copy(img, PrimaryMagic)
	binary.BigEndian.PutUint64(img[OffHdrOffset:], 0)
	SetChecksum(img[:HeaderSize])
	return img
}
