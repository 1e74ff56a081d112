package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.99.1",
		Main: debug.Module{Path: "github.com/latchkey/latchkey", Version: "v1.4.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.modified", Value: "false"}}}
	dirty := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}}
	for _, c := range []struct {
		name    string
		info    *debug.BuildInfo
		release string
		want    Info
	}{
		{"stamped", stamped, "", Info{"v1.4.0", "0123456789abcdef0123456789abcdef01234567", "go1.99.1"}},
		{"release wins", stamped, "v2.0.0", Info{"v2.0.0", "0123456789abcdef0123456789abcdef01234567", "go1.99.1"}},
		{"dirty devel", dirty, "", Info{"devel", "abc-dirty", runtime.Version()}},
		{"unstamped", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "", Info{"devel", Unknown, runtime.Version()}},
		{"no build info", nil, "", Info{"devel", Unknown, runtime.Version()}},
		// "dirty" with no revision does not invent one.
		{"modified only", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}}, "",
			Info{"devel", Unknown, runtime.Version()}},
	} {
		if got := fromBuildInfo(c.info, c.release); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestStampedBuildNamesItsCommit builds a program using this package in a
// fresh git repository with the real toolchain and checks that --version
// names the commit and the tag Go stamped: the path a release build takes.
func TestStampedBuildNamesItsCommit(t *testing.T) {
	for _, tool := range []string{"git", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := t.TempDir()
	src, err := os.ReadFile("version.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"go.mod":             "module example.com/stamped\n\ngo 1.24\n",
		"version/version.go": string(src),
		"main.go":            "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/stamped/version\"\n)\n\nfunc main() { fmt.Println(version.String(\"stamped\")) }\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=true", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("git", "init", "-q")
	run("git", "add", ".")
	run("git", "commit", "-q", "-m", "stamped")
	run("git", "tag", "v1.2.3")
	rev := run("git", "rev-parse", "HEAD")
	bin := filepath.Join(t.TempDir(), "stamped")
	run("go", "build", "-o", bin, ".")
	got := run(bin)
	if want := "stamped v1.2.3 (" + rev + ", "; !strings.HasPrefix(got, want) {
		t.Fatalf("--version of a tagged build: %q, want prefix %q", got, want)
	}
}
