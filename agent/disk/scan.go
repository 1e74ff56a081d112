package disk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/latchkey/latchkey/agent/disk/luks2"
	"golang.org/x/sys/unix"
)

// The blank-device check. A first boot destroys the whole device (the
// header install overwrites the first 16 MiB, mkfs then writes over the
// data segment), so a device is formatted only when three independent
// looks find nothing on it (docs/disk.md, "The blank-device rule"):
//
//  1. Full read of what the first boot overwrites before its commit
//     point: the first 16 MiB (header, keyslots, record gap). Also the
//     last 4 MiB, where the GPT backup header and md RAID 0.90 and 1.0
//     superblocks live. Every byte must be zero.
//  2. Signature table: the superblock magics of the formats a disk is
//     reused from, checked relative to every 1 MiB-aligned offset of the
//     device (where partitions and volumes start), plus the end-relative
//     ones (GPT backup, md 0.90, md 1.0).
//  3. Sampled scan: the probe windows read for the table at each 1 MiB
//     offset (the first 8 KiB, and one block each at +32 KiB and +64 KiB)
//     must be zero too, so every contiguous region of non-zero data of
//     at least 1 MiB is seen wherever it lies.
//
// Probe reads use O_DIRECT (no page-cache pollution, no readahead) and
// Linux AIO (aio.go), so the kernel has over a hundred small reads in
// flight; where io_setup is refused, blocking preads from a few
// goroutines do the same more slowly.

const (
	candidateStride = mib
	headScanLength  = luks2.DataOffset // everything the header install writes
	tailScanLength  = 4 * mib
	scanWorkers     = 16
	probeHeadLength = 8192 // per-candidate read at +0: sample, +0 table, +4 KiB table
)

// probeWindows are the byte ranges read at every 1 MiB-aligned candidate
// outside the fully-read head and tail, relative to the candidate. n == 0
// means one logical block.
var probeWindows = []struct{ off, n int64 }{
	{0, probeHeadLength},
	{32768, 0}, // ISO 9660 volume descriptor (32769), LUKS2 secondary at 32 KiB
	{65536, 0}, // btrfs superblock (65600), LUKS2 secondary at 64 KiB
}

// finding is something the check saw, at a byte offset of the device.
type finding struct {
	off  int64
	what string
}

// scanResult is the outcome of the blank-device check.
type scanResult struct {
	// sig is the lowest-offset signature found (nil: none).
	sig *finding
	// data is the lowest-offset non-zero byte seen (nil: none).
	data *finding
	// candidates is how many 1 MiB-aligned offsets were checked.
	candidates int64
}

func (r scanResult) blank() bool { return r.sig == nil && r.data == nil }

// describe names what was found and where, for a refusal.
func (r scanResult) describe() string {
	switch {
	case r.sig != nil && r.data != nil && r.data.off < r.sig.off:
		return fmt.Sprintf("%s at %s, and non-zero data from byte %d", r.sig.what, at(r.sig.off), r.data.off)
	case r.sig != nil:
		return fmt.Sprintf("%s at %s", r.sig.what, at(r.sig.off))
	case r.data != nil:
		return fmt.Sprintf("unrecognised non-zero data at %s (perhaps an encrypted volume, a partition's remains or a format latchkey does not know)", at(r.data.off))
	}
	return "nothing"
}

// at writes a device offset for a message, exactly: "byte 440",
// "byte 134217728 (128 MiB)", "byte 134217729 (128 MiB + 1 byte)".
func at(off int64) string {
	if off < mib {
		return fmt.Sprintf("byte %d", off)
	}
	return fmt.Sprintf("byte %d (%s)", off, human(off))
}

// human writes a byte count in whole MiB plus the exact remainder, never
// rounded.
func human(n int64) string {
	whole, rest := n/mib, n%mib
	switch {
	case rest == 0:
		return fmt.Sprintf("%d MiB", whole)
	case rest == 1:
		return fmt.Sprintf("%d MiB + 1 byte", whole)
	case rest%1024 == 0:
		return fmt.Sprintf("%d MiB + %d KiB", whole, rest/1024)
	}
	return fmt.Sprintf("%d MiB + %d bytes", whole, rest)
}

// scanner holds one run of the check over an opened device.
type scanner struct {
	d          *device
	head, tail []byte
	tailOff    int64
	block      int64 // logical block size, for O_DIRECT
	mu         sync.Mutex
	res        scanResult
	stop       atomic.Bool
}

// scanDevice runs the blank-device check on d from byte from on (0, or
// luks2.DataOffset to check everything but latchkey's own header area). It
// never writes.
//
// The order of the reads matters on loop devices over a sparse file: a
// 16 MiB sequential read that ends where the probes begin makes the
// backing file's readahead treat the probes as a sequential stream and
// read (zero-fill) the whole file, 30 to 100 times slower. So the tail
// is read first, then the probes, and the head last.
func scanDevice(ctx context.Context, d *device, from int64) (scanResult, error) {
	s := &scanner{d: d, tailOff: d.size - tailScanLength}
	var err error
	if s.tail, err = d.read(s.tailOff, tailScanLength); err != nil {
		return scanResult{}, err
	}
	if i := firstNonZero(s.tail); i >= 0 {
		s.noteData(s.tailOff + int64(i))
	}
	s.checkEnd()
	s.res.candidates = (d.size - from + candidateStride - 1) / candidateStride
	// The candidates whose windows all lie in the head or tail are
	// checked in memory; the run between them is probed. (A range, not a
	// list: a 16 TiB disk has 16 million candidates.)
	var near []int64
	first, end := from, d.size
	for ; first < end && s.inMemory(first); first += candidateStride {
		near = append(near, first)
	}
	last := (end - 1) &^ (candidateStride - 1)
	for ; last >= first && s.inMemory(last); last -= candidateStride {
		near = append(near, last)
	}
	far := candidates{start: first}
	if last >= first {
		far.n = (last-first)/candidateStride + 1
	}
	if s.res.sig == nil && far.n > 0 {
		if err := s.probeAll(ctx, far); err != nil {
			return scanResult{}, err
		}
	}
	if from < headScanLength {
		if s.head, err = d.read(0, headScanLength); err != nil {
			return scanResult{}, err
		}
		if i := firstNonZero(s.head[from:]); i >= 0 {
			s.noteData(from + int64(i))
		}
	}
	// Candidates whose windows all lie in the head or tail: in memory.
	for _, c := range near {
		s.checkCandidate(c, s.memView(c))
	}
	return s.res, nil
}

func (s *scanner) inMemory(c int64) bool {
	for _, w := range probeWindows {
		n := w.n
		if n == 0 {
			n = 4096
		}
		if !s.buffered(c+w.off, n) && c+w.off+n <= s.d.size {
			return false
		}
	}
	return true
}

// buffered reports whether [off, off+n) lies in the head or tail region
// (read in full, so not probed).
func (s *scanner) buffered(off, n int64) bool {
	return off+n <= headScanLength || (off >= s.tailOff && off+n <= s.d.size)
}

// memView reads the candidate at c from the head and tail buffers (nil
// for bytes not read, or not read yet).
func (s *scanner) memView(c int64) view {
	return func(off, n int64) []byte {
		a := c + off
		switch {
		case a < 0 || a+n > s.d.size:
			return nil
		case a+n <= int64(len(s.head)):
			return s.head[a : a+n]
		case a >= s.tailOff && s.tail != nil:
			return s.tail[a-s.tailOff : a-s.tailOff+n]
		}
		return nil
	}
}

// candidates is a run of n 1 MiB-aligned candidate offsets from start.
type candidates struct{ start, n int64 }

func (c candidates) at(i int64) int64 { return c.start + i*candidateStride }

// probeAll reads the probe windows of every far candidate, spread over
// a few workers, and stops early once a signature is found.
func (s *scanner) probeAll(ctx context.Context, far candidates) error {
	// The same open device, again, for direct I/O; a device that refuses
	// O_DIRECT is read through the page cache instead.
	self := fmt.Sprintf("/proc/self/fd/%d", s.d.f.Fd())
	f, err := os.OpenFile(self, os.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EINVAL) {
		f, err = os.OpenFile(self, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return fmt.Errorf("open %s for the blank-device scan: %w", s.d.path, err)
	}
	defer f.Close()
	s.block = 512
	if bs, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && bs >= 512 && bs <= 4096 {
		s.block = int64(bs)
	}
	if err := s.probeAIO(ctx, int(f.Fd()), far); !errors.Is(err, errNoAIO) {
		return err
	}
	// No AIO here: blocking preads from a few goroutines.
	var next atomic.Int64
	errs := make(chan error, scanWorkers)
	var wg sync.WaitGroup
	for range min(scanWorkers, far.n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.worker(ctx, int(f.Fd()), far, &next)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *scanner) worker(ctx context.Context, fd int, far candidates, next *atomic.Int64) error {
	bufs := make([][]byte, len(probeWindows))
	for i, w := range probeWindows {
		bufs[i] = alignedBuffer(s.windowLen(w.n))
	}
	for !s.stop.Load() {
		i := next.Add(1) - 1
		if i >= far.n {
			return nil
		}
		if i%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		c := far.at(i)
		got := make([][]byte, len(probeWindows))
		for j, w := range probeWindows {
			off, n := c+w.off, s.windowLen(w.n)
			if off+n > s.d.size || s.buffered(off, n) {
				continue
			}
			if _, err := unix.Pread(fd, bufs[j][:n], off); err != nil {
				return fmt.Errorf("read %s at %d: %w", s.d.path, off, err)
			}
			got[j] = bufs[j][:n]
			if k := firstNonZero(got[j]); k >= 0 {
				s.noteData(off + int64(k))
			}
		}
		s.checkCandidate(c, func(off, n int64) []byte {
			for j, w := range probeWindows {
				if got[j] != nil && off >= w.off && off+n <= w.off+int64(len(got[j])) {
					return got[j][off-w.off : off-w.off+n]
				}
			}
			return s.memView(c)(off, n)
		})
	}
	return nil
}

func (s *scanner) windowLen(n int64) int64 {
	if n == 0 {
		return s.block
	}
	return max(n, s.block)
}

// alignedBuffer is n bytes aligned to 4 KiB, as O_DIRECT needs. Go's
// heap does not move objects, so a slice into a larger one stays aligned.
func alignedBuffer(n int64) []byte {
	raw := make([]byte, n+4096)
	skip := (4096 - int(uintptr(unsafe.Pointer(&raw[0]))&4095)) & 4095
	return raw[skip : skip+int(n)]
}

func (s *scanner) noteData(off int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.res.data == nil || off < s.res.data.off {
		s.res.data = &finding{off: off}
	}
}

func (s *scanner) noteSig(off int64, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.res.sig == nil || off < s.res.sig.off {
		s.res.sig = &finding{off: off, what: what}
	}
	s.stop.Store(true)
}

func (s *scanner) checkCandidate(c int64, v view) {
	if what := matchSignature(v); what != "" {
		s.noteSig(c, what)
	}
}

// checkEnd looks for the signatures that sit relative to the device's
// end: the GPT backup header and md RAID 0.90 and 1.0 superblocks.
func (s *scanner) checkEnd() {
	v := s.memView(0)
	size := s.d.size
	for _, g := range []int64{size - 512, size - 4096} {
		if string(v(g, 8)) == "EFI PART" {
			s.noteSig(g, "a GPT backup partition table header (the primary was erased?)")
			return
		}
	}
	if off := size&^(65536-1) - 65536; isMD(v(off, 8), 0) {
		s.noteSig(off, "an md RAID superblock (version 0.90)")
		return
	}
	if off := (size - 8192) &^ (4096 - 1); isMD(v(off, 8), 1) {
		s.noteSig(off, "an md RAID superblock (version 1.0)")
	}
}

// view returns n bytes at off relative to a candidate, or nil when they
// were not read.
type view func(off, n int64) []byte

// signature is one row of the table: a check relative to a candidate.
type signature struct {
	what  string
	match func(v view) bool
	// leads are where the format's first non-zero byte lies relative
	// to its start (fullcheck.go names a full check's first non-zero
	// byte by them).
	leads []int64
}

func magicAt(off int64, magic string) func(v view) bool {
	return func(v view) bool { return string(v(off, int64(len(magic)))) == magic }
}

// mdMagic is md's superblock magic 0xa92b4efc, little-endian on disk
// for v1.x (and for v0.90 written by a little-endian host).
const mdMagic = 0xa92b4efc

// isMD checks the magic and major version of an md superblock.
func isMD(b []byte, major uint32) bool {
	if len(b) < 8 {
		return false
	}
	le := binary.LittleEndian.Uint32(b) == mdMagic && binary.LittleEndian.Uint32(b[4:]) == major
	be := major == 0 && binary.BigEndian.Uint32(b) == mdMagic && binary.BigEndian.Uint32(b[4:]) == major
	return le || be
}

func mdAt(off int64) func(v view) bool {
	return func(v view) bool { return isMD(v(off, 8), 1) }
}

func luksAt(version uint16) func(v view) bool {
	return func(v view) bool {
		b := v(0, 8)
		return b != nil && string(b[:6]) == string(luks2.PrimaryMagic) && binary.BigEndian.Uint16(b[6:]) == version
	}
}

func fatBootSector(v view) bool {
	b := v(0, 512)
	if b == nil || b[510] != 0x55 || b[511] != 0xaa {
		return false
	}
	for _, t := range []struct {
		off int
		s   string
	}{{54, "FAT12   "}, {54, "FAT16   "}, {54, "FAT     "}, {82, "FAT32   "}} {
		if string(b[t.off:t.off+len(t.s)]) == t.s {
			return true
		}
	}
	return false
}

func ext(v view) bool {
	b := v(1024, 1024)
	return b != nil && b[56] == 0x53 && b[57] == 0xef && binary.LittleEndian.Uint32(b[24:]) <= 6
}

func lvmLabel(v view) bool {
	for sector := int64(0); sector < 4; sector++ {
		if b := v(sector*512, 32); b != nil && string(b[:8]) == "LABELONE" && string(b[24:32]) == "LVM2 001" {
			return true
		}
	}
	return false
}

func swapAt(pageSize int64) func(v view) bool {
	return func(v view) bool {
		b := string(v(pageSize-10, 10))
		return b == "SWAPSPACE2" || b == "SWAP-SPACE"
	}
}

func anyOf(fs ...func(v view) bool) func(v view) bool {
	return func(v view) bool {
		for _, f := range fs {
			if f(v) {
				return true
			}
		}
		return false
	}
}

// signatures is the table, most specific first (a FAT boot sector also
// carries the MBR's 0x55AA).
var signatures = []signature{
	{"a LUKS1 header", luksAt(1), []int64{0}},
	{"a LUKS2 header", luksAt(2), []int64{0}},
	{"a LUKS2 secondary header", anyOf(magicAt(0, "SKUL\xba\xbe"), magicAt(16384, "SKUL\xba\xbe"), magicAt(32768, "SKUL\xba\xbe"), magicAt(65536, "SKUL\xba\xbe")), []int64{0, 16384, 32768, 65536}},
	{"an xfs file system", magicAt(0, "XFSB"), []int64{0}},
	{"an ext2/3/4 file system", ext, []int64{1024}},
	{"a btrfs file system", magicAt(65600, "_BHRfS_M"), []int64{65536}},
	{"an LVM physical volume", lvmLabel, []int64{512, 0, 1024, 1536}},
	{"an md RAID superblock (version 1.1)", mdAt(0), []int64{0}},
	{"an md RAID superblock (version 1.2)", mdAt(4096), []int64{4096}},
	{"a swap area", anyOf(swapAt(4096), swapAt(8192)), []int64{1024}},
	{"an ISO 9660 image", magicAt(32769, "CD001"), []int64{32768}},
	{"a bcache device", magicAt(4096+24, "\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81"), []int64{4096}},
	{"a GPT partition table", anyOf(magicAt(512, "EFI PART"), magicAt(4096, "EFI PART")), []int64{440, 446, 512, 4096}},
	{"a FAT (vfat) file system", fatBootSector, []int64{0}},
	{"an NTFS file system", magicAt(3, "NTFS    "), []int64{0}},
	{"an exFAT file system", magicAt(3, "EXFAT   "), []int64{0}},
	{"an MBR partition table or boot sector", magicAt(510, "\x55\xaa"), []int64{0, 440, 446}},
}

func matchSignature(v view) string {
	for _, sg := range signatures {
		if sg.match(v) {
			return sg.what
		}
	}
	return ""
}
