package execx

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func newLogged(t *testing.T) (*Exec, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return New(Config{Logger: log}), &buf
}

func TestRunStdinNeverLogged(t *testing.T) {
	e, logs := newLogged(t)
	secret := "s3cret-key-material"
	res, err := e.Run(context.Background(), Cmd{Name: "cat", Stdin: strings.NewReader(secret)})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if string(res.Stdout) != secret {
		t.Fatalf("stdout = %q, want the stdin bytes", res.Stdout)
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("log contains stdin: %s", logs)
	}
	for _, field := range []string{`"cmd":"cat"`, `"stdin":true`, `"exit":0`, `"duration"`} {
		if !strings.Contains(logs.String(), field) {
			t.Errorf("log lacks %s: %s", field, logs)
		}
	}
}

func TestRunFailureCarriesStderr(t *testing.T) {
	e, logs := newLogged(t)
	_, err := e.Run(context.Background(), Cmd{Name: "sh", Args: []string{"-c", "echo first >&2; echo 'device busy' >&2; exit 3"}})
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("err = %v, want *ExitError", err)
	}
	if ee.Code != 3 || ExitCode(err) != 3 {
		t.Fatalf("code = %d, want 3", ee.Code)
	}
	if want := "first | device busy"; ee.Stderr != want {
		t.Fatalf("stderr = %q, want %q", ee.Stderr, want)
	}
	if !strings.Contains(err.Error(), "exit status 3: first | device busy") {
		t.Fatalf("message = %q", err)
	}
	if !strings.Contains(logs.String(), `"level":"WARN"`) {
		t.Fatalf("failure not logged at warn: %s", logs)
	}
}

// TestAnswerExitCodeLoggedAtDebug: blkid's exit 2 ("nothing found") is
// an answer: still an *ExitError for the caller, but not a warning in
// the journal. Another exit code of the same command still warns.
func TestAnswerExitCodeLoggedAtDebug(t *testing.T) {
	e, logs := newLogged(t)
	_, err := e.Run(context.Background(), Cmd{Name: "sh", Args: []string{"-c", "exit 2"}, AnswerExitCodes: []int{2}})
	if ExitCode(err) != 2 {
		t.Fatalf("err = %v, want exit 2", err)
	}
	if !strings.Contains(logs.String(), `"level":"DEBUG"`) || strings.Contains(logs.String(), `"level":"WARN"`) {
		t.Fatalf("an answer exit code logged as: %s", logs)
	}
	logs.Reset()
	_, err = e.Run(context.Background(), Cmd{Name: "sh", Args: []string{"-c", "exit 4"}, AnswerExitCodes: []int{2}})
	if ExitCode(err) != 4 || !strings.Contains(logs.String(), `"level":"WARN"`) {
		t.Fatalf("exit 4: %v, logged as: %s", err, logs)
	}
}

func TestRunMinimalEnvironment(t *testing.T) {
	t.Setenv("LATCHKEY_TEST_SECRET", "do-not-leak")
	e := New(Config{Logger: slog.New(slog.DiscardHandler)})
	res, err := e.Run(context.Background(), Cmd{Name: "env", Env: []string{"EXTRA=1"}})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	got := strings.Fields(string(res.Stdout))
	want := []string{"PATH=" + DefaultPath, "LC_ALL=C", "EXTRA=1"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("child env = %q, want %q", got, want)
	}
}

func TestRunBoundsOutput(t *testing.T) {
	e := New(Config{Logger: slog.New(slog.DiscardHandler), MaxOutput: 100})
	res, err := e.Run(context.Background(), Cmd{Name: "head", Args: []string{"-c", "100000", "/dev/zero"}})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(res.Stdout) != 100 {
		t.Fatalf("kept %d bytes, want 100", len(res.Stdout))
	}
}

func TestRunCancelled(t *testing.T) {
	e := New(Config{Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := e.Run(ctx, Cmd{Name: "sleep", Args: []string{"10"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

func TestRunRefusesBadCommands(t *testing.T) {
	e := New(Config{Logger: slog.New(slog.DiscardHandler)})
	if _, err := e.Run(context.Background(), Cmd{Name: "latchkey-no-such-tool"}); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("missing tool: err = %v, want exec.ErrNotFound", err)
	}
	if _, err := e.Run(context.Background(), Cmd{Name: "echo", Args: []string{"a\x00b"}}); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("NUL argument: err = %v, want a refusal", err)
	}
	if _, err := e.Run(context.Background(), Cmd{}); err == nil {
		t.Error("empty name accepted")
	}
}
