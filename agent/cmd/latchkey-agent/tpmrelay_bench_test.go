package main

import (
	"io"
	"net"
	"sort"
	"sync/atomic"
	"testing"
	"time"
)

// tpmRelay stands between the agent and swtpm's command port and notes
// when the first byte of a TPM command reaches it after mark: the
// agent's exec → first TPM command, taken where swtpm would receive it
// (one loopback hop earlier), with no tracer slowing the process down.
type tpmRelay struct {
	addr  string
	first atomic.Int64 // UnixNano of the first command byte since mark; 0 none
}

// startTPMRelay relays every connection to target (swtpm's "host:port")
// until the benchmark ends.
func startTPMRelay(b *testing.B, target string) *tpmRelay {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lis.Close() })
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
			r.first.CompareAndSwap(0, time.Now().UnixNano())
			if _, werr := up.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// mark starts a new process's measurement.
func (r *tpmRelay) mark() { r.first.Store(0) }

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
