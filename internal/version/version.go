// Package version names the build of latchkey's programs for --version:
// the release set at link time (-ldflags "-X
// github.com/latchkey/latchkey/internal/version.Release=v1.2.3"), else the
// VCS revision Go records in the binary, else "devel".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Release is set at link time for release builds.
var Release = ""

// String is "<program> <release or revision> (<go version>)".
func String(program string) string {
	return fmt.Sprintf("%s %s (%s)", program, describe(), runtime.Version())
}

func describe() string {
	if Release != "" {
		return Release
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "devel-" + rev
}
