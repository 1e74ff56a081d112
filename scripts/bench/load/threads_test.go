package load

// The verifier's per-thread view: which share of an idle-time join's CPU
// is the Go runtime's sysmon thread, the monitor that polls every 20 µs
// after a system call wakes it from its deep sleep.

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// threadTime is one thread's CPU time and how often it was scheduled
// (/proc/self/task/TID/schedstat: run time ns, wait time ns, timeslices).
type threadTime struct {
	cpu    time.Duration
	slices int64
}

// sysmonThread reads the sysmon thread's times: the process's second
// thread, which the runtime starts for sysmon before anything else (its
// first system call, when idle, is a nanosleep). Zero when /proc cannot
// say.
func sysmonThread() threadTime {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return threadTime{}
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	if len(tids) < 2 {
		return threadTime{}
	}
	slices.Sort(tids)
	t, err := readSchedstat(tids[1])
	if err != nil {
		return threadTime{}
	}
	return t
}

func readSchedstat(tid int) (threadTime, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", tid))
	if err != nil {
		return threadTime{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return threadTime{}, fmt.Errorf("schedstat of thread %d: %d fields, want 3", tid, len(f))
	}
	run, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return threadTime{}, fmt.Errorf("schedstat of thread %d: %w", tid, err)
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return threadTime{}, fmt.Errorf("schedstat of thread %d: %w", tid, err)
	}
	return threadTime{cpu: time.Duration(run), slices: n}, nil
}
