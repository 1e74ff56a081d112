package cli

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestParseExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		ok   bool
	}{
		{[]string{"-v=1"}, 0, true},
		{[]string{"--help"}, ExitOK, false},
		{[]string{"-h"}, ExitOK, false},
		{[]string{"--bogus"}, ExitUsage, false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Int("v", 0, "")
		code, ok := Parse(fs, tc.args)
		if code != tc.code || ok != tc.ok {
			t.Errorf("%v: code %d ok %v, want %d %v", tc.args, code, ok, tc.code, tc.ok)
		}
	}
}

func TestCheckLogLevel(t *testing.T) {
	for _, l := range []string{"debug", "info", "warn", "error", "INFO"} {
		if err := CheckLogLevel(l); err != nil {
			t.Errorf("%q: %v", l, err)
		}
	}
	if err := CheckLogLevel("bogus"); err == nil || !strings.Contains(err.Error(), `--log-level "bogus": want debug, info, warn or error`) {
		t.Fatalf("bogus: %v", err)
	}
}

func TestIsVersion(t *testing.T) {
	if !IsVersion([]string{"--version"}) || !IsVersion([]string{"version"}) || IsVersion([]string{"--version", "x"}) || IsVersion(nil) {
		t.Fatal("IsVersion")
	}
}

func TestOverrideKeepsWhatAnEmptyFlagDoesNotSay(t *testing.T) {
	v := "from-file"
	Override(&v, "")
	if v != "from-file" {
		t.Fatalf("an empty flag replaced the file's value: %q", v)
	}
	Override(&v, "from-flag")
	if v != "from-flag" {
		t.Fatalf("the flag did not win: %q", v)
	}
}
