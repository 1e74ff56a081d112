package cli

import (
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/logging"
)

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

// The flags override the file's log section; a bad flag is named as the
// flag, a bad file value as the log key.
func TestLogFlagsResolve(t *testing.T) {
	file := logging.Config{Level: "debug", Format: "json"}
	for _, tc := range []struct {
		flags   LogFlags
		file    logging.Config
		want    logging.Config
		wantErr string
	}{
		{LogFlags{}, file, file, ""},
		{LogFlags{Format: "text"}, file, logging.Config{Level: "debug", Format: "text"}, ""},
		{LogFlags{Level: "error"}, file, logging.Config{Level: "error", Format: "json"}, ""},
		{LogFlags{Level: "loud"}, file, logging.Config{}, `--log-level "loud": want debug, info, warn or error`},
		{LogFlags{Format: "xml"}, file, logging.Config{}, `--log-format "xml": want text or json`},
		{LogFlags{}, logging.Config{Format: "xml"}, logging.Config{}, `log: log format "xml": want text or json`},
		// A good flag covers a bad file value: the flag wins.
		{LogFlags{Format: "text"}, logging.Config{Format: "xml"}, logging.Config{Format: "text"}, ""},
	} {
		got, err := tc.flags.Resolve(tc.file)
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%+v over %+v: %v, want %q", tc.flags, tc.file, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v over %+v: %+v %v, want %+v", tc.flags, tc.file, got, err, tc.want)
		}
	}
}
