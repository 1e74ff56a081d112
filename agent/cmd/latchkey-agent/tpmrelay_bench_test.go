package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"testing"
	"time"
)

// tpmRelay stands between the agent and swtpm's command port and notes
// when the first byte of a TPM command reaches it after mark: the
// agent's exec → first TPM command, taken where swtpm would receive it
// (one loopback hop earlier), with no tracer slowing the process down.
// At that byte it also reads the agent's scheduler statistics (before
// forwarding it, while the agent waits for the answer): how much CPU its
// threads had used by then and how long they had waited for one, which
// the wall time alone cannot tell apart on a loaded machine.
type tpmRelay struct {
	addr  string
	first atomic.Int64 // UnixNano of the first command byte since mark; 0 none
	pid   atomic.Int64 // the process being measured; 0 not yet known
	sched atomic.Pointer[schedStat]
	// onFirst, when set before the agent starts, runs at the first
	// command byte since mark, before the byte is forwarded.
	onFirst func()
}

// schedStat is a process's threads' time on a CPU and waiting in a run
// queue, summed (/proc/PID/task/*/schedstat).
type schedStat struct{ cpu, wait time.Duration }

// readSchedStat sums pid's threads' scheduler statistics.
func readSchedStat(pid int64) (*schedStat, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return nil, fmt.Errorf("no threads of %d: %v", pid, err)
	}
	var st schedStat
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			return nil, err
		}
		var cpu, wait, slices int64
		if _, err := fmt.Sscan(string(b), &cpu, &wait, &slices); err != nil {
			return nil, fmt.Errorf("%s: %w", t, err)
		}
		st.cpu += time.Duration(cpu)
		st.wait += time.Duration(wait)
	}
	return &st, nil
}

// startTPMRelay relays every connection to target (swtpm's "host:port")
// until the benchmark ends.
func startTPMRelay(tb testing.TB, target string) *tpmRelay {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { lis.Close() })
	r := &tpmRelay{addr: lis.Addr().String()}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go r.relay(c, target)
		}
	}()
	return r
}

func (r *tpmRelay) relay(c net.Conn, target string) {
	defer c.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	go func() { io.Copy(c, up); c.Close() }()
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if r.first.CompareAndSwap(0, time.Now().UnixNano()) {
				r.noteSched()
				if r.onFirst != nil {
					r.onFirst()
				}
			}
			if _, werr := up.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// noteSched keeps the measured process's scheduler statistics, when its
// pid is known and it has threads to read.
func (r *tpmRelay) noteSched() {
	if pid := r.pid.Load(); pid != 0 {
		if st, err := readSchedStat(pid); err == nil {
			r.sched.Store(st)
		}
	}
}

// mark starts a new process's measurement.
func (r *tpmRelay) mark() {
	r.first.Store(0)
	r.pid.Store(0)
	r.sched.Store(nil)
}

// started tells the relay which process it measures.
func (r *tpmRelay) started(pid int) { r.pid.Store(int64(pid)) }

// schedAtFirst is the measured process's CPU and run-queue wait up to its
// first TPM command; ok is false when they could not be read (its pid
// was not known yet when the command arrived).
func (r *tpmRelay) schedAtFirst() (st schedStat, ok bool) {
	if p := r.sched.Load(); p != nil {
		return *p, true
	}
	return schedStat{}, false
}

// since is the time from start to the first TPM command after mark.
func (r *tpmRelay) since(b *testing.B, start time.Time) time.Duration {
	ns := r.first.Load()
	if ns == 0 {
		b.Fatal("no TPM command reached the relay")
	}
	return time.Unix(0, ns).Sub(start)
}

// median is the middle of ds (the mean of the two middle values for an
// even count); the machine is shared, so medians, not means, are reported.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ms is d in milliseconds for ReportMetric.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
