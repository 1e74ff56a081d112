package app

import (
	"os"
	"runtime"
	"sync"
)

// GCHeadroom is the heap floor ReserveGCHeadroom sets up (64 MiB).
const GCHeadroom = 64 << 20

var (
	headroomOnce sync.Once
	// headroom is never read: holding it keeps its bytes live, which is
	// all it is for.
	headroom []byte
)

// ReserveGCHeadroom gives the garbage collector a heap floor: a live
// allocation of GCHeadroom bytes that is never written, so the kernel
// backs none of it with memory, but that the collector's pacing counts.
// `serve` calls it once at start; it does nothing when GOGC or
// GOMEMLIMIT is set in the environment (the operator's choice wins), and
// it is idempotent.
//
// Why: a join allocates about 125 KiB, and a verifier between boot storms
// holds about 7 MiB live. With the default pacing (GOGC=100, the next
// cycle when the heap doubles) an idle-time verifier collects every ~56
// joins, and every cycle also runs mark workers on otherwise idle cores,
// so a join at a tenth of capacity cost twice the GC of a join in a storm
// (docs/benchmarks.md, "The verifier's cost at realistic rates"). With the
// floor a cycle comes every ~570 joins at idle and every ~700 under load.
// What it costs is bounded: at most GCHeadroom more garbage resident
// before a cycle, at any load. A higher GOGC would multiply every peak
// instead (a storm's 470 MiB by its factor), and GOMEMLIMIT is a ceiling,
// not a floor.
func ReserveGCHeadroom() {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	headroomOnce.Do(func() {
		headroom = make([]byte, GCHeadroom)
		runtime.KeepAlive(headroom)
	})
}
