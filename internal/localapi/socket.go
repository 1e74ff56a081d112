package localapi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/latchkey/latchkey/internal/peercred"
)

// SocketConfig says where the admin socket goes and who may open it. The
// file mode is a coarse first gate; the peer-credential policy of the
// server is the real one.
type SocketConfig struct {
	Path string
	// Group, a name or gid, owns the socket (mode 0660) so its members can
	// connect. Empty: mode 0600, only the owner and root can connect.
	Group string
	// Mode overrides the mode, e.g. 0660 for a DynamicUser daemon: its own
	// user and group, and root, may connect; the peer-credential policy
	// decides who is served.
	Mode os.FileMode
}

// Listen creates the admin socket. A stale socket left by a crashed
// process is replaced; a socket some process still serves, or a path that
// is not a socket, is an error.
func Listen(cfg SocketConfig) (net.Listener, error) {
	if !filepath.IsAbs(cfg.Path) {
		return nil, fmt.Errorf("localapi: socket path %q is not absolute", cfg.Path)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o755); err != nil {
		return nil, fmt.Errorf("localapi: %w", err)
	}
	if err := removeStale(cfg.Path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("localapi: %w", err)
	}
	if err := setAccess(cfg); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func setAccess(cfg SocketConfig) error {
	mode := cfg.Mode
	if cfg.Group != "" {
		gid, err := peercred.LookupGroup(cfg.Group)
		if err != nil {
			return fmt.Errorf("localapi: %w", err)
		}
		if err := os.Chown(cfg.Path, -1, int(gid)); err != nil {
			return fmt.Errorf("localapi: hand socket to group %s: %w", cfg.Group, err)
		}
		if mode == 0 {
			mode = 0o660
		}
	}
	if mode == 0 {
		mode = 0o600
	}
	if err := os.Chmod(cfg.Path, mode); err != nil {
		return fmt.Errorf("localapi: %w", err)
	}
	return nil
}

func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("localapi: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("localapi: %s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("localapi: %s is served by another process", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("localapi: probe %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("localapi: remove stale socket: %w", err)
	}
	return nil
}

// Dial connects a CLI to the admin socket at path (AgentSocket,
// VerifierSocket). The connection is lazy: errors show on the first call.
func Dial(path string) (*grpc.ClientConn, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("localapi: socket path %q is not absolute", path)
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(peercred.ClientCredentials()))
	if err != nil {
		return nil, fmt.Errorf("localapi: %w", err)
	}
	return conn, nil
}
