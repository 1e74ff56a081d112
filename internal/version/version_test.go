package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestStringNamesProgramReleaseAndGo(t *testing.T) {
	old := Release
	defer func() { Release = old }()
	Release = "v9.9.9"
	if got, want := String("latchkey-agent"), "latchkey-agent v9.9.9 ("+runtime.Version()+")"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	Release = ""
	if got := String("x"); !strings.HasPrefix(got, "x devel") {
		t.Fatalf("unreleased build: %q", got)
	}
}
