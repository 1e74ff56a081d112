package sdnotify

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/latchkey/latchkey/internal/sdnotify/sdnotifytest"
)

// listenNotify stands in for systemd: a unixgram socket at $NOTIFY_SOCKET.
func listenNotify(t *testing.T) *net.UnixConn {
	t.Helper()
	c, path := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", path)
	return c
}

func readDatagram(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	return string(buf[:n])
}

func TestNotificationsReachNotifySocket(t *testing.T) {
	c := listenNotify(t)
	n := New(Config{})
	steps := []struct {
		call func() error
		want string
	}{
		{func() error { return n.Status("attesting to v1:7443\n(attempt 3)") }, "STATUS=attesting to v1:7443 (attempt 3)"},
		{n.Ready, "READY=1"},
		{func() error { return n.ReadyStatus("joined") }, "READY=1\nSTATUS=joined"},
		{n.Stopping, "STOPPING=1"},
	}
	for _, s := range steps {
		if err := s.call(); err != nil {
			t.Fatal(err)
		}
		if got := readDatagram(t, c); got != s.want {
			t.Fatalf("got %q, want %q", got, s.want)
		}
	}
}

func TestNoServiceManagerIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := New(Config{})
	for _, err := range []error{n.Ready(), n.Status("x"), n.Stopping()} {
		if err != nil {
			t.Fatalf("want no-op outside systemd, got %v", err)
		}
	}
}

func TestBrokenNotifySocketIsAnError(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent.sock"))
	if err := New(Config{}).Ready(); err == nil || !strings.Contains(err.Error(), "READY") {
		t.Fatalf("want an error naming READY, got %v", err)
	}
}

func TestStatusIsCutOnACharacterBoundary(t *testing.T) {
	long := strings.Repeat("é", maxStatus) // two bytes each
	got := cleanStatus(long)
	if len(got) > maxStatus || !utf8.ValidString(got) {
		t.Fatalf("cut status is %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	if got := cleanStatus("bad \xff byte"); got != "bad ? byte" {
		t.Fatalf("cleanStatus kept invalid UTF-8: %q", got)
	}
}

func TestWatchdogPingsAtHalfTheInterval(t *testing.T) {
	c := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "40000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(osGetpid()))
	n := New(Config{})
	if d, err := n.WatchdogInterval(); err != nil || d != 40*time.Millisecond {
		t.Fatalf("WatchdogInterval = %v, %v; want 40ms", d, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Watchdog(ctx, nil) }()
	for range 3 {
		if got := readDatagram(t, c); got != "WATCHDOG=1" {
			t.Fatalf("got %q, want WATCHDOG=1", got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestWatchdogForOtherPIDIsOff(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "40000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(osGetpid()+1))
	if err := New(Config{}).Watchdog(context.Background(), nil); err != nil {
		t.Fatalf("Watchdog without a watchdog for this pid: %v", err)
	}
}

func TestWatchdogWithholdsPingWhenUnhealthy(t *testing.T) {
	var mu sync.Mutex
	var sent []string
	checks := make(chan struct{}, 16)
	n := New(Config{
		WatchdogInterval: 8 * time.Millisecond,
		Send: func(s string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, s)
			return true, nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- n.Watchdog(ctx, func(context.Context) error {
			checks <- struct{}{}
			return errors.New("policy snapshot missing")
		})
	}()
	for range 3 {
		<-checks
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 0 {
		t.Fatalf("unhealthy process pinged the watchdog: %q", sent)
	}
}

func TestStatusExtendAsksForMoreTime(t *testing.T) {
	var got string
	n := New(Config{Send: func(state string) (bool, error) { got = state; return true, nil }})
	if err := n.StatusExtend("checking\nthe disk", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got != "STATUS=checking the disk\nEXTEND_TIMEOUT_USEC=30000000" {
		t.Fatalf("sent %q", got)
	}
}
