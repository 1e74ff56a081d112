// Package predict computes, from image artefacts and with no boot, the
// reference values a machine booting them shows: the Authenticode digests
// UEFI firmware measures into PCR 4 for each EFI application (boot loader,
// UKI), and the PCR 11 value systemd-stub and systemd-pcrphase leave for
// each boot phase (what `systemd-measure calculate` computes). For Intel
// TDX (PredictTDX) the digests are SHA-384 and the RTMRs are a reference
// boot's CC event log with the new boot chain substituted: the firmware's
// own events cannot be derived from the artefacts. It backs
// `latchkey-verifier policy predict`, whose output pastes into the policy.
package predict

import (
	"crypto"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// MaxImageSize bounds a PE image predict reads (UKIs with a large initrd
// reach a few hundred MiB).
const MaxImageSize = 1 << 30

// pe is the layout of a PE/COFF image that Authenticode and the section
// reader need, validated against the file's length.
type pe struct {
	data          []byte
	checksumOff   int // optional header CheckSum field
	certDirOff    int // data directory entry 4 (Certificate Table)
	sizeOfHeaders int
	certOff       int // file offset of the certificate table, 0 if none
	certSize      int
	sections      []section
}

type section struct {
	name            string
	virtualSize     int
	rawOff, rawSize int
}

// parsePE reads the headers: DOS stub, PE signature, COFF header, optional
// header (PE32 or PE32+), section table. Every offset is bounds-checked.
func parsePE(b []byte) (*pe, error) {
	u16 := func(off int) (int, error) {
		if off < 0 || off+2 > len(b) {
			return 0, errors.New("truncated pe headers")
		}
		return int(binary.LittleEndian.Uint16(b[off:])), nil
	}
	u32 := func(off int) (int, error) {
		if off < 0 || off+4 > len(b) {
			return 0, errors.New("truncated pe headers")
		}
		return int(binary.LittleEndian.Uint32(b[off:])), nil
	}
	if len(b) < 0x40 || b[0] != 'M' || b[1] != 'Z' {
		return nil, errors.New("not a pe image (no MZ header)")
	}
	peOff, err := u32(0x3c)
	if err != nil || peOff+24 > len(b) || string(b[peOff:peOff+4]) != "PE\x00\x00" {
		return nil, errors.New("not a pe image (no PE signature)")
	}
	coff := peOff + 4
	nSections, _ := u16(coff + 2)
	optSize, _ := u16(coff + 16)
	opt := coff + 20
	magic, err := u16(opt)
	if err != nil {
		return nil, err
	}
	var dirs int
	switch magic {
	case 0x10b:
		dirs = opt + 96
	case 0x20b:
		dirs = opt + 112
	default:
		return nil, fmt.Errorf("unknown optional header magic %#x", magic)
	}
	p := &pe{data: b, checksumOff: opt + 64, certDirOff: dirs + 4*8}
	if p.certDirOff+8 > opt+optSize {
		return nil, errors.New("optional header has no certificate table entry")
	}
	if p.sizeOfHeaders, err = u32(opt + 60); err != nil || p.sizeOfHeaders > len(b) {
		return nil, errors.New("SizeOfHeaders beyond the file")
	}
	p.certOff, _ = u32(p.certDirOff)
	p.certSize, _ = u32(p.certDirOff + 4)
	if p.certSize > 0 && (p.certOff < p.sizeOfHeaders || p.certOff+p.certSize != len(b)) {
		return nil, errors.New("certificate table is not at the end of the file")
	}
	table := opt + optSize
	for i := range nSections {
		off := table + 40*i
		if off+40 > p.sizeOfHeaders {
			return nil, errors.New("section table beyond the headers")
		}
		name := string(b[off : off+8])
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		vs, _ := u32(off + 8)
		rs, _ := u32(off + 16)
		ro, _ := u32(off + 20)
		if rs > 0 && (ro < p.sizeOfHeaders || ro+rs > len(b)) {
			return nil, fmt.Errorf("section %q lies outside the file", name)
		}
		p.sections = append(p.sections, section{name: name, virtualSize: vs, rawOff: ro, rawSize: rs})
	}
	return p, nil
}

// Authenticode is the SHA-256 Authenticode digest of a PE image, as UEFI
// firmware measures an EFI application into PCR 4 (PE/COFF specification,
// "Calculating the PE Image Hash"): the headers without the CheckSum field
// and the Certificate Table entry, the sections in file order, and any
// data after them except the certificate table.
func Authenticode(image []byte) ([sha256.Size]byte, error) {
	d, err := AuthenticodeHash(image, crypto.SHA256)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return [sha256.Size]byte(d), nil
}

// Authenticode384 is the SHA-384 Authenticode digest, what TDX firmware
// measures into RTMR[1].
func Authenticode384(image []byte) ([sha512.Size384]byte, error) {
	d, err := AuthenticodeHash(image, crypto.SHA384)
	if err != nil {
		return [sha512.Size384]byte{}, err
	}
	return [sha512.Size384]byte(d), nil
}

// AuthenticodeHash is the Authenticode digest of a PE image under hash.
func AuthenticodeHash(image []byte, hash crypto.Hash) ([]byte, error) {
	p, err := parsePE(image)
	if err != nil {
		return nil, err
	}
	h := hash.New()
	b := p.data
	h.Write(b[:p.checksumOff])
	h.Write(b[p.checksumOff+4 : p.certDirOff])
	h.Write(b[p.certDirOff+8 : p.sizeOfHeaders])
	secs := append([]section(nil), p.sections...)
	sort.SliceStable(secs, func(i, j int) bool { return secs[i].rawOff < secs[j].rawOff })
	hashed := p.sizeOfHeaders
	for _, s := range secs {
		if s.rawSize == 0 {
			continue
		}
		h.Write(b[s.rawOff : s.rawOff+s.rawSize])
		hashed += s.rawSize
	}
	end := len(b) - p.certSize
	if hashed < end {
		h.Write(b[hashed:end])
	}
	return h.Sum(nil), nil
}
