// Package execx is the one way latchkey runs external programs
// (cryptsetup, blkid, mkfs, kubeadm, ...).
//
// Keeping every command behind one small Runner interface buys three
// things: each run is logged the same way (program, arguments, exit code,
// duration as slog fields), a failure carries the program's stderr so the
// journal line says why it failed, and unit tests swap in a Fake with
// behaviour switches instead of real binaries.
//
// Secrets never go into an argument list: a process's argv is world
// readable in /proc. A secret is handed over on Stdin (cryptsetup
// --key-file -, for instance), which this package never logs. Arguments
// are logged verbatim, so callers must keep them secret-free; Run refuses
// arguments that are obviously unsafe (embedded NUL bytes).
//
// Children get a minimal environment (PATH and LC_ALL=C, so messages are
// stable, plus Cmd.Env) rather than the agent's: the agent's environment
// may hold credentials (systemd's $CREDENTIALS_DIRECTORY and friends) that
// a tool has no business seeing.
package execx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/latchkey/latchkey/internal/logkey"
)

// DefaultPath is the PATH children get when Config.Path is empty.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// DefaultMaxOutput bounds each of stdout and stderr when Config.MaxOutput
// is zero, so a runaway tool cannot exhaust the agent's memory.
const DefaultMaxOutput = 1 << 20

// Cmd is one program run.
type Cmd struct {
	// Name is the program, looked up in the child's PATH.
	Name string
	// Args are the arguments. They are logged: never put a secret here.
	Args []string
	// Stdin feeds the child's standard input; use it for secrets. It is
	// never logged or kept.
	Stdin io.Reader
	// Env holds extra KEY=value entries on top of the minimal environment.
	Env []string
	// Dir is the working directory ("" = the agent's).
	Dir string
	// ExtraFiles are passed to the child as fd 3, 4, ... (for example a
	// memfd the child addresses as /dev/fd/3).
	ExtraFiles []*os.File
	// AnswerExitCodes are non-zero exit codes that are an answer rather
	// than a failure (blkid's 2, "nothing found"): Run still returns the
	// *ExitError, but logs the run at debug level, not as a warning.
	AnswerExitCodes []int
}

// String is the command line as logged (never contains stdin).
func (c Cmd) String() string {
	return strings.TrimSpace(c.Name + " " + strings.Join(c.Args, " "))
}

// Result is what a finished program left behind.
type Result struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
	Duration time.Duration
}

// Runner runs commands. Run returns an *ExitError when the program ran
// and exited non-zero (Result is filled in either case), and another error
// when it could not be started or was cancelled.
type Runner interface {
	Run(ctx context.Context, cmd Cmd) (Result, error)
}

// ExitError is a program that ran and failed. Its message carries the
// (trimmed, bounded) stderr, so one log line says what went wrong.
type ExitError struct {
	Cmd    string
	Code   int
	Stderr string
}

func (e *ExitError) Error() string {
	msg := fmt.Sprintf("%s: exit status %d", e.Cmd, e.Code)
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

// ExitCode returns the exit code of an *ExitError in err's chain, or -1.
func ExitCode(err error) int {
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return -1
}

// Config configures Exec. The zero value is usable.
type Config struct {
	// Logger receives one record per run (default slog.Default()).
	Logger *slog.Logger
	// Path is the children's PATH (default DefaultPath).
	Path string
	// MaxOutput bounds stdout and stderr each (default DefaultMaxOutput).
	MaxOutput int
	// WaitDelay is how long a cancelled child may take to exit after the
	// kill before its pipes are closed (default 5s).
	WaitDelay time.Duration
}

// Exec runs real programs.
type Exec struct {
	cfg Config
}

// New returns a real Runner.
func New(cfg Config) *Exec {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Path == "" {
		cfg.Path = DefaultPath
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	if cfg.WaitDelay <= 0 {
		cfg.WaitDelay = 5 * time.Second
	}
	return &Exec{cfg: cfg}
}

// Run runs cmd to completion.
func (e *Exec) Run(ctx context.Context, cmd Cmd) (Result, error) {
	if err := check(cmd); err != nil {
		return Result{}, err
	}
	path, err := lookPath(cmd.Name, e.cfg.Path)
	if err != nil {
		e.log(ctx, cmd, Result{ExitCode: -1}, err)
		return Result{ExitCode: -1}, err
	}
	c, stdout, stderr := e.build(ctx, path, cmd)
	start := time.Now()
	err = c.Run()
	res := Result{
		Stdout:   stdout.Bytes(),
		Stderr:   stderr.Bytes(),
		ExitCode: c.ProcessState.ExitCode(), // -1 when it never started
		Duration: time.Since(start),
	}
	err = e.classify(ctx, cmd, res, err)
	e.log(ctx, cmd, res, err)
	return res, err
}

func check(cmd Cmd) error {
	if cmd.Name == "" {
		return errors.New("execx: empty command name")
	}
	for _, a := range append([]string{cmd.Name}, cmd.Args...) {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("execx: %s: argument contains a NUL byte", cmd.Name)
		}
	}
	return nil
}

func (e *Exec) build(ctx context.Context, path string, cmd Cmd) (*exec.Cmd, *boundedBuffer, *boundedBuffer) {
	c := exec.CommandContext(ctx, path, cmd.Args...)
	c.Args[0] = cmd.Name
	c.Env = append([]string{"PATH=" + e.cfg.Path, "LC_ALL=C"}, cmd.Env...)
	c.Dir = cmd.Dir
	c.Stdin = cmd.Stdin
	c.ExtraFiles = cmd.ExtraFiles
	c.WaitDelay = e.cfg.WaitDelay
	stdout := &boundedBuffer{max: e.cfg.MaxOutput}
	stderr := &boundedBuffer{max: e.cfg.MaxOutput}
	c.Stdout, c.Stderr = stdout, stderr
	return c, stdout, stderr
}

// lookPath resolves name in the children's PATH rather than the agent's.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			continue
		}
		p := dir + "/" + name
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("execx: %s: %w in %s", name, exec.ErrNotFound, path)
}

func (e *Exec) classify(ctx context.Context, cmd Cmd, res Result, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("execx: %s: %w", cmd.Name, ctx.Err())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return &ExitError{Cmd: cmd.String(), Code: res.ExitCode, Stderr: trimStderr(res.Stderr)}
	}
	return fmt.Errorf("execx: %s: %w", cmd.Name, err)
}

// trimStderr keeps the last 2 KiB of stderr, trimmed, on one line.
func trimStderr(b []byte) string {
	const keep = 2048
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	s := strings.TrimSpace(string(b))
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " | ")), " ")
}

func (e *Exec) log(ctx context.Context, cmd Cmd, res Result, err error) {
	attrs := []slog.Attr{
		slog.String(logkey.Command, cmd.Name),
		slog.Any(logkey.Args, cmd.Args),
		slog.Bool(logkey.Stdin, cmd.Stdin != nil),
		slog.Int(logkey.Exit, res.ExitCode),
		slog.Duration(logkey.Duration, res.Duration),
	}
	level := slog.LevelDebug
	if err != nil && !slices.Contains(cmd.AnswerExitCodes, ExitCode(err)) {
		level = slog.LevelWarn
	}
	if err != nil {
		attrs = append(attrs, slog.String(logkey.Error, err.Error()))
	}
	e.cfg.Logger.LogAttrs(ctx, level, "exec", attrs...)
}

// boundedBuffer keeps the first max bytes and silently drops the rest
// (reporting them written, so the child never blocks on a full pipe).
// It deliberately does not embed bytes.Buffer: io.Copy would use the
// embedded ReadFrom and bypass the bound.
type boundedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	room := b.max - b.buf.Len()
	if room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Bytes returns what was kept.
func (b *boundedBuffer) Bytes() []byte { return b.buf.Bytes() }
