// Package version names the build of latchkey's programs, for --version
// and the verifier's build_info metric. The version is the release set at
// link time (-ldflags "-X
// github.com/latchkey/latchkey/internal/version.Release=v1.2.3"), else the
// module version Go stamps from the VCS (a tag, or a pseudo-version of the
// commit), else "devel". The revision is the commit Go stamps
// (vcs.revision, "-dirty" when the tree had changes). Go stamps both only
// when it builds inside a git checkout with -buildvcs left on (not in a
// git worktree, whose .git is a file Go does not recognise); a build
// without them says "devel" and "unknown" rather than guess.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Release is set at link time for release builds.
var Release = ""

// Unknown is the revision of a build Go stamped no commit into.
const Unknown = "unknown"

// Info describes one build.
type Info struct {
	// Version is the release, the stamped module version or "devel".
	Version string
	// Revision is the full commit hash (with "-dirty" for a modified
	// tree) or Unknown.
	Revision string
	// GoVersion is the toolchain that built the program.
	GoVersion string
}

// Get describes the running program.
func Get() Info {
	info, _ := debug.ReadBuildInfo()
	return fromBuildInfo(info, Release)
}

// String is "<program> <version> (<revision>, <go version>)".
func String(program string) string {
	i := Get()
	return fmt.Sprintf("%s %s (%s, %s)", program, i.Version, i.Revision, i.GoVersion)
}

// fromBuildInfo reads what the toolchain stamped; info may be nil (a
// binary built without module support).
func fromBuildInfo(info *debug.BuildInfo, release string) Info {
	i := Info{Version: "devel", Revision: Unknown, GoVersion: runtime.Version()}
	if info == nil {
		if release != "" {
			i.Version = release
		}
		return i
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		i.Version = v
	}
	if release != "" {
		i.Version = release
	}
	if info.GoVersion != "" {
		i.GoVersion = info.GoVersion
	}
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && i.Revision != Unknown {
		i.Revision += "-dirty"
	}
	return i
}
