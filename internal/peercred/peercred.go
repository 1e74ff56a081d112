// Package peercred gives gRPC servers on a Unix socket the identity of the
// process that called: the kernel's record of the peer's uid, gid,
// supplementary groups and pid (SO_PEERCRED, SO_PEERGROUPS), taken when the
// peer connected and impossible for it to forge. The transport credentials
// attach that identity to every call of the connection; handlers read it
// with FromContext, and Policy admits only root or members of configured
// groups.
//
// This is the local admin API's only authentication: the socket's file
// mode is a coarse first gate, the peer credentials are the real one.
package peercred

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Creds identify the process at the other end of a Unix socket, as the
// kernel recorded them when that process connected (or created the socket
// pair).
type Creds struct {
	UID uint32
	GID uint32
	// Groups are the peer's supplementary groups at connect time.
	Groups []uint32
	// PID is the peer's process ID at connect time. It identifies the
	// caller in logs only: the process may have exited since and the pid
	// been reused, so never authorize by it.
	PID int32
}

// String formats the credentials for log lines.
func (c Creds) String() string {
	return "uid=" + strconv.FormatUint(uint64(c.UID), 10) +
		" gid=" + strconv.FormatUint(uint64(c.GID), 10) +
		" pid=" + strconv.FormatInt(int64(c.PID), 10)
}

// InGroup reports whether gid is the peer's primary or a supplementary
// group.
func (c Creds) InGroup(gid uint32) bool {
	if c.GID == gid {
		return true
	}
	for _, g := range c.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// ErrNotUnix is returned for a connection that is not a Unix socket: peer
// credentials exist only there, and serving the admin API elsewhere would
// leave it unauthenticated.
var ErrNotUnix = errors.New("peercred: not a unix socket connection")

// maxGroups bounds the supplementary group list read from the kernel
// (NGROUPS_MAX is 65536; real callers have a handful).
const maxGroups = 65536

// Read returns the credentials of conn's peer.
func Read(conn net.Conn) (Creds, error) {
	if conn.LocalAddr() == nil || conn.LocalAddr().Network() != "unix" {
		return Creds{}, ErrNotUnix
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return Creds{}, ErrNotUnix
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return Creds{}, fmt.Errorf("peercred: %w", err)
	}
	var c Creds
	var opErr error
	if err := raw.Control(func(fd uintptr) { c, opErr = readFD(int(fd)) }); err != nil {
		return Creds{}, fmt.Errorf("peercred: %w", err)
	}
	return c, opErr
}

func readFD(fd int) (Creds, error) {
	u, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return Creds{}, fmt.Errorf("peercred: SO_PEERCRED: %w", err)
	}
	groups, err := peerGroups(fd)
	if err != nil {
		return Creds{}, err
	}
	return Creds{UID: u.Uid, GID: u.Gid, Groups: groups, PID: u.Pid}, nil
}

// peerGroups reads SO_PEERGROUPS, growing the buffer when the kernel says
// ERANGE (it then reports the size it needs).
func peerGroups(fd int) ([]uint32, error) {
	n := 32
	for {
		buf := make([]uint32, n)
		size := uint32(n * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch {
		case errno == 0:
			return buf[:size/4], nil
		case errno == unix.ERANGE && int(size/4) > n && int(size/4) <= maxGroups:
			n = int(size / 4)
		default:
			return nil, fmt.Errorf("peercred: SO_PEERGROUPS: %w", errno)
		}
	}
}

// AuthInfo is the credentials.AuthInfo of a peercred connection.
type AuthInfo struct {
	credentials.CommonAuthInfo
	Creds Creds
}

// AuthType names the scheme.
func (AuthInfo) AuthType() string { return "peercred" }

// FromContext returns the caller's credentials inside a handler of a server
// that uses these transport credentials.
func FromContext(ctx context.Context) (Creds, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Creds{}, false
	}
	ai, ok := p.AuthInfo.(AuthInfo)
	if !ok {
		return Creds{}, false
	}
	return ai.Creds, true
}
