package sdnotify

import (
	"errors"
	"fmt"
	"net"

	"github.com/coreos/go-systemd/v22/activation"
)

// Sockets are the listening sockets systemd passed to the process
// (socket activation), by their FileDescriptorName= ("join" for
// latchkey-verifier.socket).
type Sockets map[string][]net.Listener

// TakeSockets takes over the sockets systemd passed ($LISTEN_FDS) and
// clears the LISTEN_* variables so children do not inherit them. Outside
// socket activation it returns an empty set. A passed descriptor that is
// not a listening stream socket is an error: the socket unit is wrong, and
// serving on something else would be worse than not starting.
func TakeSockets() (Sockets, error) {
	files := activation.Files(true)
	s := Sockets{}
	var errs []error
	for _, f := range files {
		l, err := net.FileListener(f)
		_ = f.Close() // FileListener holds its own duplicate
		if err != nil {
			errs = append(errs, fmt.Errorf("sdnotify: passed socket %q: %w", f.Name(), err))
			continue
		}
		s[f.Name()] = append(s[f.Name()], l)
	}
	if err := errors.Join(errs...); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// One returns the single socket named name and removes it from s. It
// returns nil without error when systemd passed no such socket (fall back
// to the configured listen address), and an error when it passed several.
func (s Sockets) One(name string) (net.Listener, error) {
	ls := s[name]
	switch len(ls) {
	case 0:
		return nil, nil
	case 1:
		delete(s, name)
		return ls[0], nil
	default:
		return nil, fmt.Errorf("sdnotify: systemd passed %d sockets named %q, want one", len(ls), name)
	}
}

// Close closes every socket still in s (those nobody took with One).
func (s Sockets) Close() {
	for name, ls := range s {
		for _, l := range ls {
			_ = l.Close()
		}
		delete(s, name)
	}
}
