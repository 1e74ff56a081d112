// Package benchtest holds what latchkey's benchmarks measure the same
// way: CPU time from the kernel's accounting (/proc for another process,
// getrusage for this one), so a figure does not depend on what a process
// says about itself, and nearest-rank latency quantiles, so the p50 and
// p99 of one benchmark mean what they mean in another.
//
// Test-only: the shipped binaries must not link it (scripts/test.sh
// checks), and it imports nothing of the product's.
package benchtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ProcessCPU is the user+system time of process pid (all its threads)
// from /proc/PID/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks int64
	for _, field := range f[11:13] { // utime, stime (fields 14 and 15)
		n, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / clockTicks), nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// TreeCPU is ProcessCPU of pid plus that of its direct children (a
// setsid or netns wrapper's): children that cannot be read (gone
// already) count nothing.
func TreeCPU(pid int) (time.Duration, error) {
	total, err := ProcessCPU(pid)
	if err != nil {
		return 0, err
	}
	kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	for _, f := range strings.Fields(string(kids)) {
		if c, err := strconv.Atoi(f); err == nil {
			if d, err := ProcessCPU(c); err == nil {
				total += d
			}
		}
	}
	return total, nil
}

// SelfCPU is this process's user+system time (getrusage): a load
// generator's or a client's own share of a run.
func SelfCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Quantile is the q-quantile (0 < q <= 1) of sorted (ascending) by
// nearest rank: the sample at rank round(q·n), clamped to the first and
// the last. It is 0 for no samples.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
