// Package cli holds the command-line conventions both programs share:
// one command table per program (table.go) from which help, usage lines
// and each command's flag list are generated; --help and `help` exit 0
// (the user asked for it), a flag error or unknown command exits 2 (bad
// usage); the log flags override the configuration file's log section.
package cli

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/latchkey/latchkey/internal/logging"
)

// Exit codes every command of both programs uses for its command line.
const (
	// ExitOK: help was asked for and printed.
	ExitOK = 0
	// ExitUsage: the command line (or configuration) is wrong.
	ExitUsage = 2
)

// CheckLogLevel refuses a --log-level slog does not know, instead of
// quietly logging at info.
func CheckLogLevel(level string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return nil
}

// IsVersion reports whether args ask for the version (version, --version
// or -version as the only argument).
func IsVersion(args []string) bool {
	if len(args) != 1 {
		return false
	}
	switch args[0] {
	case "version", "--version", "-version":
		return true
	}
	return false
}

// Override sets *dst to v unless v is empty: a string flag left unset
// keeps what the configuration file (or the kernel command line) said.
func Override(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// LogFlags are --log-level and --log-format, which override the
// configuration file's log: section. Both default to empty (the file's
// setting, else info-level text).
type LogFlags struct{ Level, Format string }

// RegisterLogFlags defines --log-level and --log-format on fs.
func RegisterLogFlags(fs *flag.FlagSet) *LogFlags {
	l := &LogFlags{}
	fs.StringVar(&l.Level, "log-level", "", "debug, info, warn or error (overrides log.level; default info)")
	fs.StringVar(&l.Format, "log-format", "", "text or json (overrides log.format; default text)")
	return l
}

// Resolve lays the flags over the file's log section and checks the
// result, naming the flag when a flag is wrong.
func (l *LogFlags) Resolve(file logging.Config) (logging.Config, error) {
	if err := CheckLogLevel(l.Level); l.Level != "" && err != nil {
		return logging.Config{}, err
	}
	if err := (logging.Config{Format: l.Format}).Validate(); err != nil {
		return logging.Config{}, fmt.Errorf("--log-format %q: want text or json", l.Format)
	}
	c := file.Override(logging.Config{Level: l.Level, Format: l.Format})
	if err := c.Validate(); err != nil {
		return logging.Config{}, fmt.Errorf("log: %w", err)
	}
	return c, nil
}
