package logging

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// logFile returns a file and the $JOURNAL_STREAM value that names it.
func logFile(t *testing.T) (*os.File, string) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return f, fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

func lines(t *testing.T, f *os.File) []string {
	t.Helper()
	raw, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(raw)), "\n")
}

func TestJournalGetsPriorities(t *testing.T) {
	f, stream := logFile(t)
	t.Setenv("JOURNAL_STREAM", stream)
	log := slog.New(NewLogHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	log = log.With("component", "agent").WithGroup("disk")
	log.Debug("probe", "uuid", "u-1")
	log.Info("open")
	log.Warn("slow")
	log.Error("refused", "reason", "PCR_MISMATCH")
	want := []string{
		`<7>level=DEBUG msg=probe component=agent disk.uuid=u-1`,
		`<6>level=INFO msg=open component=agent`,
		`<4>level=WARN msg=slow component=agent`,
		`<3>level=ERROR msg=refused component=agent disk.reason=PCR_MISMATCH`,
	}
	got := lines(t, f)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestOtherStreamIsPlainText(t *testing.T) {
	f, _ := logFile(t)
	t.Setenv("JOURNAL_STREAM", "1:2") // the journal is some other file
	slog.New(NewLogHandler(f, nil)).Info("open")
	got := lines(t, f)
	if len(got) != 1 || !strings.HasPrefix(got[0], "time=") || !strings.HasSuffix(got[0], "level=INFO msg=open") {
		t.Fatalf("got %q, want a plain text line with time", got)
	}
}

// format: json is slog JSON, one object a line, at the configured level,
// with no journal prefix even on the journal stream (the JSON carries its
// own level).
func TestJSONFormat(t *testing.T) {
	f, stream := logFile(t)
	t.Setenv("JOURNAL_STREAM", stream)
	log := slog.New(NewHandler(f, Config{Level: "warn", Format: FormatJSON}))
	log.Info("hidden")
	log.Warn("slow", "node", "n1")
	got := lines(t, f)
	if len(got) != 1 {
		t.Fatalf("got %q, want one line (info is below warn)", got)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(got[0]), &m); err != nil {
		t.Fatalf("not JSON: %q: %v", got[0], err)
	}
	if m["level"] != "WARN" || m["msg"] != "slow" || m["node"] != "n1" || m["time"] == nil {
		t.Fatalf("got %v", m)
	}
}

func TestConfigValidateAndOverride(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{}, ""},
		{Config{Level: "debug", Format: "json"}, ""},
		{Config{Level: "loud"}, `log level "loud": want debug, info, warn or error`},
		{Config{Format: "JSON"}, `log format "JSON": want text or json`},
		{Config{Format: "logfmt"}, `log format "logfmt": want text or json`},
	} {
		err := tc.c.Validate()
		if (err == nil) != (tc.want == "") || (err != nil && err.Error() != tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
	got := Config{Level: "debug", Format: "json"}.Override(Config{Format: "text"})
	if got != (Config{Level: "debug", Format: "text"}) {
		t.Fatalf("override: %+v", got)
	}
}
