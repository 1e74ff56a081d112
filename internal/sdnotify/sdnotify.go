// Package sdnotify tells systemd how a latchkey program is doing: READY=1
// when it can serve (the agent: state disk open; the verifier: listening),
// STATUS= lines a human reads in `systemctl status`, watchdog pings, and
// STOPPING=1 on the way out. It also hands over the sockets systemd opened
// for a socket-activated verifier.
//
// It is a thin layer over github.com/coreos/go-systemd/v22: outside systemd
// (no $NOTIFY_SOCKET) every call is a no-op, so the programs run the same
// from a shell or a test.
package sdnotify

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/latchkey/latchkey/internal/logkey"
)

// maxStatus bounds a STATUS= line: systemd reads notifications into a
// buffer of a few KiB and a status line is for one terminal line anyway.
const maxStatus = 512

// SendFunc delivers one notification datagram. It reports false when no
// service manager listens ($NOTIFY_SOCKET unset).
type SendFunc func(state string) (bool, error)

// Config configures a Notifier. The zero value notifies the real service
// manager through $NOTIFY_SOCKET and reads $WATCHDOG_USEC.
type Config struct {
	// Send replaces the delivery, for tests; nil uses go-systemd.
	Send SendFunc
	// WatchdogInterval replaces the $WATCHDOG_USEC lookup, for tests; zero
	// reads the environment.
	WatchdogInterval time.Duration
	Logger           *slog.Logger
}

// Notifier sends sd_notify(3) messages.
type Notifier struct {
	send     SendFunc
	interval time.Duration
	log      *slog.Logger
}

// New returns a Notifier. It leaves $NOTIFY_SOCKET set so later STATUS=
// lines still work; with NotifyAccess=main in the units, children such as
// kubeadm cannot change the service state through it.
func New(cfg Config) *Notifier {
	n := &Notifier{send: cfg.Send, interval: cfg.WatchdogInterval, log: cfg.Logger}
	if n.send == nil {
		n.send = func(state string) (bool, error) { return daemon.SdNotify(false, state) }
	}
	if n.log == nil {
		n.log = slog.Default()
	}
	return n
}

// Ready tells systemd the unit is up: for Type=notify units the start job
// completes and units ordered after this one may start.
func (n *Notifier) Ready() error { return n.notify(daemon.SdNotifyReady) }

// ReadyStatus is Ready with a status line in the same datagram, so
// `systemctl status` never shows a stale "starting" line on a ready unit.
func (n *Notifier) ReadyStatus(status string) error {
	return n.notify(daemon.SdNotifyReady + "\nSTATUS=" + cleanStatus(status))
}

// Status sets the free-form status line `systemctl status` shows, e.g.
// "attesting to verifier-1:7443 (attempt 3)". Newlines become spaces and
// long lines are cut.
func (n *Notifier) Status(status string) error {
	return n.notify("STATUS=" + cleanStatus(status))
}

// StatusExtend sets the status line and asks systemd to extend the
// unit's start (or stop) timeout by d from now (EXTEND_TIMEOUT_USEC=), for
// a long step that reports progress, such as reading a whole disk.
func (n *Notifier) StatusExtend(status string, d time.Duration) error {
	return n.notify(fmt.Sprintf("STATUS=%s\nEXTEND_TIMEOUT_USEC=%d", cleanStatus(status), d.Microseconds()))
}

// Stopping tells systemd a stop is under way (graceful shutdown started),
// so it does not treat the remaining work as a hang.
func (n *Notifier) Stopping() error { return n.notify(daemon.SdNotifyStopping) }

func (n *Notifier) notify(state string) error {
	if _, err := n.send(state); err != nil {
		return fmt.Errorf("sdnotify: %s: %w", firstField(state), err)
	}
	return nil
}

func cleanStatus(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == 0 {
			return ' '
		}
		return r
	}, strings.TrimSpace(strings.ToValidUTF8(s, "?")))
	if len(s) > maxStatus {
		s = s[:maxStatus]
		for !utf8.ValidString(s) { // do not leave half a character
			s = s[:len(s)-1]
		}
	}
	return s
}

func firstField(state string) string {
	if i := strings.IndexAny(state, "=\n"); i > 0 {
		return state[:i]
	}
	return state
}

// WatchdogInterval returns the watchdog timeout systemd set for this
// process (WatchdogSec=), or 0 when no watchdog applies.
func (n *Notifier) WatchdogInterval() (time.Duration, error) {
	if n.interval > 0 {
		return n.interval, nil
	}
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, fmt.Errorf("sdnotify: watchdog: %w", err)
	}
	return d, nil
}

// Watchdog pings systemd's watchdog at half the WatchdogSec= interval until
// ctx ends. Before each ping it asks healthy (nil: always healthy); a
// failing check skips the ping, so a wedged process is killed and
// restarted by systemd instead of lingering. Without a watchdog it returns
// nil at once.
func (n *Notifier) Watchdog(ctx context.Context, healthy func(context.Context) error) error {
	interval, err := n.WatchdogInterval()
	if err != nil || interval == 0 {
		return err
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		n.pingOnce(ctx, interval/4, healthy)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (n *Notifier) pingOnce(ctx context.Context, budget time.Duration, healthy func(context.Context) error) {
	if healthy != nil {
		hctx, cancel := context.WithTimeout(ctx, budget)
		err := healthy(hctx)
		cancel()
		if err != nil {
			n.log.Warn("health check failed; watchdog ping withheld", logkey.Error, err)
			return
		}
	}
	if err := n.notify(daemon.SdNotifyWatchdog); err != nil {
		n.log.Warn("watchdog ping failed", logkey.Error, err)
	}
}
