// Package logging builds the latchkey programs' logger: slog text on
// stderr, with a syslog priority on every line when stderr is the journal
// stream systemd connected, so journald files each entry at its level.
package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
)

// NewLogHandler returns the slog handler a latchkey program logs with. When
// w is the journal stream systemd connected ($JOURNAL_STREAM names its
// device and inode), every line starts with a "<N>" syslog priority, which
// journald turns into the entry's level (so `journalctl -p err` works), and
// the time is left out (journald stamps each entry). Anywhere else it is a
// plain slog.TextHandler on w.
func NewLogHandler(w *os.File, opts *slog.HandlerOptions) slog.Handler {
	if !isJournalStream(w) {
		return slog.NewTextHandler(w, opts)
	}
	return newPrefixHandler(w, opts)
}

// isJournalStream compares w with $JOURNAL_STREAM ("<dev>:<ino>").
func isJournalStream(w *os.File) bool {
	env := os.Getenv("JOURNAL_STREAM")
	if env == "" {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(w.Fd()), &st); err != nil {
		return false
	}
	return env == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// prefixHandler formats with a TextHandler into a buffer and writes the
// line with its priority prefix. Derived handlers share the buffer and
// the lock.
type prefixHandler struct {
	mu   *sync.Mutex
	buf  *bytes.Buffer
	w    io.Writer
	text slog.Handler
}

func newPrefixHandler(w io.Writer, opts *slog.HandlerOptions) *prefixHandler {
	o := slog.HandlerOptions{}
	if opts != nil {
		o = *opts
	}
	replace := o.ReplaceAttr
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		if replace != nil {
			return replace(groups, a)
		}
		return a
	}
	buf := &bytes.Buffer{}
	return &prefixHandler{mu: &sync.Mutex{}, buf: buf, w: w, text: slog.NewTextHandler(buf, &o)}
}

func (h *prefixHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.text.Enabled(ctx, l)
}

func (h *prefixHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf.Reset()
	if err := h.text.Handle(ctx, r); err != nil {
		return err
	}
	_, err := fmt.Fprintf(h.w, "<%d>%s", priority(r.Level), h.buf.Bytes())
	return err
}

func (h *prefixHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &prefixHandler{mu: h.mu, buf: h.buf, w: h.w, text: h.text.WithAttrs(as)}
}

func (h *prefixHandler) WithGroup(name string) slog.Handler {
	return &prefixHandler{mu: h.mu, buf: h.buf, w: h.w, text: h.text.WithGroup(name)}
}

// priority maps slog levels to syslog priorities (sd-daemon(3)).
func priority(l slog.Level) int {
	switch {
	case l < slog.LevelInfo:
		return 7 // debug
	case l < slog.LevelWarn:
		return 6 // info
	case l < slog.LevelError:
		return 4 // warning
	default:
		return 3 // err
	}
}

// NewLogger is the programs' logger: stderr, at level ("debug", "info",
// "warn" or "error"; anything else is info), with levels journald sees.
func NewLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(NewLogHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}
