// Package logging builds the latchkey programs' logger: slog text (or,
// when asked, slog JSON for a log pipeline) on stderr, with a syslog
// priority on every text line when stderr is the journal stream systemd
// connected, so journald files each entry at its level.
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

// Config is the log section of both programs' configuration files
// (log: {level, format}); the --log-level and --log-format flags
// override it. The zero value is info-level text.
type Config struct {
	// Level is debug, info (default), warn or error.
	Level string `json:"level,omitempty"`
	// Format is text (default; journald levels under systemd) or json
	// (one slog JSON object per line, for a log pipeline).
	Format string `json:"format,omitempty"`
}

// Formats the Format setting accepts.
const (
	FormatText = "text"
	FormatJSON = "json"
)

// Validate refuses a level or format this package does not know, instead
// of quietly logging at info or as text.
func (c Config) Validate() error {
	if c.Level != "" {
		var l slog.Level
		if err := l.UnmarshalText([]byte(c.Level)); err != nil {
			return fmt.Errorf("log level %q: want debug, info, warn or error", c.Level)
		}
	}
	switch c.Format {
	case "", FormatText, FormatJSON:
		return nil
	}
	return fmt.Errorf("log format %q: want text or json", c.Format)
}

// Override returns c with the non-empty fields of o (the flags) on top.
func (c Config) Override(o Config) Config {
	if o.Level != "" {
		c.Level = o.Level
	}
	if o.Format != "" {
		c.Format = o.Format
	}
	return c
}

// New is the programs' logger on stderr as c asks; an invalid c (which
// Validate refuses first) logs info-level text.
func New(c Config) *slog.Logger {
	return slog.New(NewHandler(os.Stderr, c))
}

// NewHandler is New's handler on w: JSON when asked (JSON carries its
// own "level" field, so no journal prefix), else NewLogHandler.
func NewHandler(w *os.File, c Config) slog.Handler {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.Level)); err != nil {
		l = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: l}
	if c.Format == FormatJSON {
		return slog.NewJSONHandler(w, opts)
	}
	return NewLogHandler(w, opts)
}
