// Package cli holds the command-line conventions both programs share:
// --help exits 0 (the user asked for it), a flag error exits 2 (bad
// usage), and a log level is checked before anything runs.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
)

// Exit codes every command of both programs uses for its command line.
const (
	// ExitOK: help was asked for and printed.
	ExitOK = 0
	// ExitUsage: the command line (or configuration) is wrong.
	ExitUsage = 2
)

// Parse parses args into fs. ok is false when the command must stop; code
// is then what it exits with (ExitOK after -h/--help, ExitUsage for a
// flag error, which fs has already printed).
func Parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return ExitOK, false
	}
	return ExitUsage, false
}

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
