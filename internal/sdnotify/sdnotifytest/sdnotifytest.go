// Package sdnotifytest stands in for systemd's notify socket in tests: a
// unixgram socket in the test's temporary folder that the code under test
// finds through $NOTIFY_SOCKET.
//
// Test only: scripts/test.sh fails the build check when a shipped binary
// links it.
package sdnotifytest

import (
	"net"
	"path/filepath"
	"testing"
)

// Listen opens the socket, closed at the end of the test, and returns it
// with its path (the value for $NOTIFY_SOCKET).
func Listen(tb testing.TB) (*net.UnixConn, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c, path
}
