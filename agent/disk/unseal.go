package disk

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"github.com/anatol/luks.go"
	"github.com/latchkey/latchkey/agent/disk/luks2"
)

// Unsealing works on a detached copy of the header. luks.go reads the
// header itself when it opens a device, so validating the device and then
// handing luks.go the device path would let a host that controls the disk
// swap the header between the two reads (validate a good header, unlock a
// cipher_null one). Instead the header and keyslot bytes that were
// validated are written into an anonymous memory file, luks.go opens that
// (/proc/self/fd/N) and unseals the volume key from it, and the dm-crypt
// table is built from the resulting Volume with the backing device set to
// the major:minor of the descriptor that was read. Nothing luks.go or the
// kernel uses is read from the disk a second time.

// unsealDetached unseals the volume key of the validated header in head
// (at least luks2.HeadAndKeyslot bytes) with key. backing ("major:minor") and
// devSize describe the real device; backing may be empty for a check that
// maps nothing.
func unsealDetached(head []byte, key []byte, backing string, devSize int64) (*luks.Volume, error) {
	mem, err := memFile("latchkey-luks-header", luks2.DataOffset)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	if _, err := mem.WriteAt(head[:luks2.HeadAndKeyslot], 0); err != nil {
		return nil, fmt.Errorf("detached header copy: %w", err)
	}
	dev, err := luks.Open(procSelfFD(mem))
	if err != nil {
		return nil, fmt.Errorf("luks.go open of the detached header: %w", err)
	}
	defer dev.Close()
	if dev.Version() != 2 || !slices.Equal(dev.Slots(), []int{0}) {
		return nil, fmt.Errorf("%w: luks.go sees version %d, keyslots %v", ErrHeaderRejected, dev.Version(), dev.Slots())
	}
	vol, err := dev.UnsealVolume(0, key)
	if errors.Is(err, luks.ErrPassphraseDoesNotMatch) {
		return nil, fmt.Errorf("unseal state disk: the ticket's key does not open it: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("unseal state disk: %w", err)
	}
	return pinVolume(vol, backing, devSize)
}

// pinVolume points the volume at the real device and checks luks.go read
// the same segment the validator accepted.
func pinVolume(vol *luks.Volume, backing string, devSize int64) (*luks.Volume, error) {
	vol.BackingDevice = backing
	vol.StorageSize = uint64(devSize - luks2.DataOffset)
	switch {
	case vol.StorageEncryption != luks2.Cipher, vol.StorageSectorSize != luks2.SectorSize,
		vol.StorageOffset != luks2.DataOffset, vol.StorageIvTweak != 0, len(vol.Flags) != 0:
		return nil, fmt.Errorf("%w: luks.go volume %s/%d/%d/%d/%v differs from the validated header",
			ErrHeaderRejected, vol.StorageEncryption, vol.StorageSectorSize, vol.StorageOffset, vol.StorageIvTweak, vol.Flags)
	}
	return vol, nil
}

// procSelfFD is how luks.go (and a child process) reaches a memory file.
func procSelfFD(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }
