//go:build linux

package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/anatol/devmapper.go"
	"golang.org/x/sys/unix"
)

// verityName is the device-mapper name of the verified root; the mapping
// shows up as /dev/mapper/root in the booted system's tools (dmsetup).
const verityName = "root"

// verityArgs is the dm-verity part of the kernel command line, in the
// names systemd-veritysetup-generator reads, so one command line boots
// both this init and a systemd initrd:
//
//	roothash=<hex>
//	systemd.verity_root_data=<device>  systemd.verity_root_hash=<device>
//	systemd.verity_root_options=superblock=false,data-blocks=N,hash-offset=BYTES,salt=<hex>,...
//
// Everything the kernel needs is on the command line (no superblock is
// read from the disk), so the whole verity geometry is measured with the
// command line: a host that edits the hash device or the data device
// cannot change what is checked.
type verityArgs struct {
	rootHash      string // hex; empty means no verity root
	dataDevice    string
	hashDevice    string
	hashAlgorithm string // hash=, default sha256
	salt          string // hex, or "-" for none
	dataBlockSize uint64
	hashBlockSize uint64
	dataBlocks    uint64
	hashOffset    uint64 // bytes into the hash device
	onCorruption  string // panic (default), restart or eio
}

// parseVerityOptions reads systemd.verity_root_options. Every option the
// init does not know is an error: a silently ignored option would boot a
// root with weaker checks than the command line asks for.
func parseVerityOptions(v *verityArgs, opts string) error {
	for _, o := range strings.Split(opts, ",") {
		if o == "" {
			continue
		}
		k, val, _ := strings.Cut(o, "=")
		var err error
		switch k {
		case "superblock":
			if val != "false" {
				return fmt.Errorf("verity option %q: only superblock=false is supported (the geometry comes from the command line)", o)
			}
		case "hash":
			v.hashAlgorithm = val
		case "salt":
			v.salt = val
		case "data-block-size":
			v.dataBlockSize, err = strconv.ParseUint(val, 10, 64)
		case "hash-block-size":
			v.hashBlockSize, err = strconv.ParseUint(val, 10, 64)
		case "data-blocks":
			v.dataBlocks, err = strconv.ParseUint(val, 10, 64)
		case "hash-offset":
			v.hashOffset, err = strconv.ParseUint(val, 10, 64)
		case "panic-on-corruption":
			v.onCorruption = "panic"
		case "restart-on-corruption":
			v.onCorruption = "restart"
		case "ignore-corruption":
			return fmt.Errorf("verity option %q refused: it would boot a corrupted root", o)
		default:
			return fmt.Errorf("unknown verity option %q", o)
		}
		if err != nil {
			return fmt.Errorf("verity option %q: %w", o, err)
		}
	}
	return nil
}

// validate checks the verity arguments before anything is mapped: a hex
// root hash of the algorithm's size, a hex salt, both devices, power-of-two
// block sizes from 512 bytes to a page, a data block count, and a hash
// offset on a hash block boundary.
func (v *verityArgs) validate() error {
	raw, err := hex.DecodeString(v.rootHash)
	if err != nil || len(raw) == 0 {
		return fmt.Errorf("roothash %q is not hex", v.rootHash)
	}
	if v.hashAlgorithm == "sha256" && len(raw) != 32 {
		return fmt.Errorf("roothash has %d bytes, sha256 needs 32", len(raw))
	}
	if v.salt != "-" {
		if _, err := hex.DecodeString(v.salt); err != nil {
			return fmt.Errorf("verity salt %q is not hex", v.salt)
		}
	}
	if v.dataDevice == "" || v.hashDevice == "" {
		return fmt.Errorf("roothash= needs systemd.verity_root_data= and systemd.verity_root_hash=")
	}
	for _, bs := range []uint64{v.dataBlockSize, v.hashBlockSize} {
		if bs < 512 || bs > 4096 || bs&(bs-1) != 0 {
			return fmt.Errorf("verity block size %d: want a power of two in 512..4096", bs)
		}
	}
	if v.dataBlocks == 0 {
		return fmt.Errorf("verity data-blocks missing (superblock=false needs it)")
	}
	if v.hashOffset%v.hashBlockSize != 0 {
		return fmt.Errorf("verity hash-offset %d is not a multiple of the hash block size", v.hashOffset)
	}
	return nil
}

// table is the dm-verity target line for these arguments (format 1, the
// one veritysetup writes).
func (v *verityArgs) table() devmapper.VerityTable {
	params := []string{}
	switch v.onCorruption {
	case "panic":
		params = append(params, "1", "panic_on_corruption")
	case "restart":
		params = append(params, "1", "restart_on_corruption")
	}
	// devmapper.go takes Start and Length in bytes (it divides by 512).
	return devmapper.VerityTable{
		Start:          0,
		Length:         v.dataBlocks * v.dataBlockSize,
		HashType:       1,
		DataDevice:     v.dataDevice,
		HashDevice:     v.hashDevice,
		DataBlockSize:  v.dataBlockSize,
		HashBlockSize:  v.hashBlockSize,
		NumDataBlocks:  v.dataBlocks,
		HashStartBlock: v.hashOffset / v.hashBlockSize,
		Algorithm:      v.hashAlgorithm,
		Digest:         v.rootHash,
		Salt:           v.salt,
		Params:         params,
	}
}

// openVerity maps the verified root read-only and returns its device node.
// The kernel checks every block read against the root hash from then on;
// with panic-on-corruption (the default) a changed block panics the
// kernel, so a tampered root never gets as far as attesting.
func openVerity(v verityArgs) (string, error) {
	if err := v.validate(); err != nil {
		return "", err
	}
	for _, dev := range []string{v.dataDevice, v.hashDevice} {
		if err := waitFor(dev, rootWait); err != nil {
			return "", err
		}
	}
	if err := devmapper.CreateAndLoad(verityName, "", devmapper.ReadOnlyFlag, v.table()); err != nil {
		return "", fmt.Errorf("dm-verity %s over %s: %w", verityName, v.dataDevice, err)
	}
	info, err := devmapper.InfoByName(verityName)
	if err != nil {
		return "", fmt.Errorf("dm-verity %s: %w", verityName, err)
	}
	node := fmt.Sprintf("/dev/dm-%d", unix.Minor(info.DevNo))
	if err := waitFor(node, 5*time.Second); err != nil {
		return "", err
	}
	logf("dm-verity root %s on %s (data %s, hash %s, root hash %s)", verityName, node, v.dataDevice, v.hashDevice, v.rootHash)
	return node, nil
}

// readOnlyCheck refuses a verity root that would be mounted writable:
// ext4 would try to replay its journal and fail on the read-only mapping.
func readOnlyCheck(a bootArgs) error {
	if a.verity.rootHash != "" && !a.ro {
		return fmt.Errorf("roothash= needs a read-only root: put \"ro\" on the command line")
	}
	if _, err := os.Stat("/dev/mapper/control"); a.verity.rootHash != "" && err != nil {
		return fmt.Errorf("device-mapper not available (dm-mod/dm-verity missing from the initrd?): %w", err)
	}
	return nil
}
