package issuer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
)

// DefaultDevice is the kernel's TPM resource manager. It is the default
// because it swaps transient objects and sessions per open file, so the
// agent cannot exhaust the TPM's few object slots even if another program
// leaks some.
const DefaultDevice = "/dev/tpmrm0"

// tcpScheme prefixes a swtpm command-port address ("tcp://127.0.0.1:2321").
const tcpScheme = "tcp://"

const (
	// tpmHeaderSize is the tag (2), size (4) and code (4) of every TPM
	// command and response.
	tpmHeaderSize = 10
	// maxResponseSize bounds what a TPM connection may send back: a TPM's
	// largest response (TPM_PT_MAX_RESPONSE_SIZE) is 4096 bytes on every
	// TPM we know, and go-tpm reads into a 4096-byte buffer.
	maxResponseSize = 4096
	dialTimeout     = 5 * time.Second
)

// OpenDevice opens a TPM and returns go-tpm's transport for it.
//
// path "" or DefaultDevice opens the kernel resource manager; any other
// filesystem path opens that character device; "tcp://HOST:PORT" dials the
// command port of a swtpm (or any TPM speaking the raw command stream over
// TCP, without the Microsoft simulator's framing, so no PowerOn is sent).
// The transport is a transport.TPMCloser because every command in this
// package goes through go-tpm's tpm2 API; wrap it with transport.ToReadWriter
// for legacy code that wants an io.ReadWriter.
func OpenDevice(path string) (transport.TPMCloser, error) {
	c, err := open(path)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// tpmConn is one open TPM. netConn is set for TCP TPMs, whose blocked
// commands a cancelled context can interrupt.
type tpmConn struct {
	transport.TPMCloser
	netConn net.Conn
}

func open(path string) (*tpmConn, error) {
	if path == "" {
		path = DefaultDevice
	}
	if addr, ok := strings.CutPrefix(path, tcpScheme); ok {
		return dialTCP(addr)
	}
	t, err := linuxtpm.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open tpm %s: %w", path, err)
	}
	return &tpmConn{TPMCloser: t}, nil
}

func dialTCP(addr string) (*tpmConn, error) {
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("dial tpm %s: %w", addr, err)
	}
	return &tpmConn{TPMCloser: transport.FromReadWriteCloser(&framedConn{Conn: conn}), netConn: conn}, nil
}

// interruptible makes TPM I/O on a TCP TPM fail once ctx is done (a swtpm
// serves one client at a time, so a command can wait behind another
// client indefinitely). The returned func ends the watch. A character
// device cannot be interrupted; the kernel bounds its commands.
func (c *tpmConn) interruptible(ctx context.Context) (stop func()) {
	if c.netConn == nil {
		return func() {}
	}
	stopWatch := context.AfterFunc(ctx, func() { _ = c.netConn.SetDeadline(time.Unix(1, 0)) })
	return func() { stopWatch() }
}

// framedConn makes a byte stream behave like a TPM character device: one
// Read returns one whole response. go-tpm issues a single Read per command,
// which is correct for /dev/tpm* but may see half a response on TCP.
type framedConn struct {
	net.Conn
}

func (c *framedConn) Read(p []byte) (int, error) {
	var hdr [tpmHeaderSize]byte
	if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
		return 0, fmt.Errorf("read tpm response header: %w", err)
	}
	size := int(binary.BigEndian.Uint32(hdr[2:6]))
	if size < tpmHeaderSize || size > maxResponseSize || size > len(p) {
		return 0, errors.New("tpm response size out of range")
	}
	n := copy(p, hdr[:])
	if _, err := io.ReadFull(c.Conn, p[n:size]); err != nil {
		return 0, fmt.Errorf("read tpm response body: %w", err)
	}
	return size, nil
}
