package luks2

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/latchkey/latchkey/protocol"
)

// MadeByLatchkey recognises a LUKS2 header latchkey created by what
// latchkey wrote, not by the fields cryptsetup config or luksAddKey
// change: a header whose label, subsystem, tokens or keyslots were
// edited is still the node's own disk (refused with the recovery path,
// never the wipe hint). Either copy counts: latchkey's label or
// subsystem, or the layout only latchkey's luksFormat produces (a
// keyslots area of exactly 15695872 bytes before a data segment at
// 16 MiB; cryptsetup's default keyslots area is 16744448 bytes).
func MadeByLatchkey(head []byte) bool {
	for _, c := range []struct {
		off   int
		magic string
	}{{0, PrimaryMagic}, {SecondaryOffset, SecondaryMagic}} {
		area := head[c.off : c.off+HeaderSize]
		if string(area[:6]) != c.magic {
			continue
		}
		sub := cString(area[OffSubsystem : OffSubsystem+48])
		if cString(area[OffLabel:OffLabel+48]) == HeaderLabel || strings.HasPrefix(sub, subsystemPrefix) {
			return true
		}
		var js struct {
			Config struct {
				KeyslotsSize string `json:"keyslots_size"`
			} `json:"config"`
			Segments map[string]struct {
				Offset string `json:"offset"`
			} `json:"segments"`
		}
		if json.Unmarshal([]byte(cString(area[BinHeaderSize:])), &js) == nil &&
			js.Config.KeyslotsSize == strconv.Itoa(KeyslotsSize) && js.Segments["0"].Offset == strconv.Itoa(DataOffset) {
			return true
		}
	}
	return false
}

// CheckInterruptedSecondary validates the secondary header of an
// interrupted install as a complete header's copy is validated, and the
// primary JSON area against it; it returns what is wrong, or "".
func CheckInterruptedSecondary(head []byte) string {
	_, sj, err := checkOneHeader(head[SecondaryOffset:SecondaryOffset+HeaderSize], SecondaryMagic, SecondaryOffset)
	if err != nil {
		return "secondary header: " + err.Error()
	}
	if err := checkShape(sj); err != nil {
		return err.Error()
	}
	pp, err := SlotParamsOf(sj)
	if err != nil {
		return err.Error()
	}
	if pp.AreaOffset != AreaA {
		return fmt.Sprintf("keyslot 0 in area at %d, a fresh install uses %d", pp.AreaOffset, AreaA)
	}
	pjs := head[BinHeaderSize:HeaderSize]
	if !allZero(pjs) && !bytes.Equal(pjs, head[SecondaryOffset+BinHeaderSize:SecondaryOffset+HeaderSize]) {
		return "the primary JSON area is neither empty nor the secondary's"
	}
	return ""
}

// InstallSecondary reports whether the binary secondary header in head
// is latchkey's (version 2, the fixed size and offset, latchkey's label,
// a canonical UUID) and returns its UUID: the first test of an
// interrupted install, before its JSON is judged.
func InstallSecondary(head []byte) (string, bool) {
	sec := head[SecondaryOffset : SecondaryOffset+BinHeaderSize]
	h := ParseBinary(sec)
	ok := h.Version == 2 && h.HdrSize == HeaderSize && h.HdrOffset == SecondaryOffset &&
		fixedField(sec[OffLabel:OffLabel+48], HeaderLabel) && protocol.ValidDiskUUID(h.UUID)
	return h.UUID, ok
}
