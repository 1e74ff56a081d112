// Package execxtest holds a fake execx.Runner for unit tests of logic
// that runs programs; it lives apart from execx so the shipped binaries
// never link it (scripts/test.sh checks).
package execxtest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"

	"github.com/latchkey/latchkey/internal/execx"
)

// Fake is a Runner for unit tests. It records every call (stdin read in
// full, so a test can check a secret went over stdin and not argv) and
// answers from Rules; a call no rule matches goes to Next, or succeeds
// with empty output when Next is nil.
type Fake struct {
	// Rules are tried in order; the first match answers.
	Rules []Rule
	// Next runs calls no rule matched (for example a real *Exec, to fail
	// one step of an otherwise real run). Nil means "succeed, no output".
	Next execx.Runner

	mu    sync.Mutex
	calls []Call
}

// Rule is one behaviour switch.
type Rule struct {
	// Match is a prefix of the command line "name arg1 arg2 ...".
	Match string
	// Stdout, Stderr and ExitCode form the answer; a non-zero ExitCode
	// makes Run return an *execx.ExitError carrying Stderr
	// (trimmed of surrounding space; write it as the real Runner reports
	// it, on one line).
	Stdout, Stderr string
	ExitCode       int
	// Err, when set, is returned as is (a start failure, say).
	Err error
	// Times limits how often the rule fires (0 = always).
	Times int

	fired int
}

// Call is one recorded run.
type Call struct {
	Cmd   execx.Cmd
	Stdin []byte
}

// Run records cmd and answers it.
func (f *Fake) Run(ctx context.Context, cmd execx.Cmd) (execx.Result, error) {
	var stdin []byte
	if cmd.Stdin != nil {
		b, err := io.ReadAll(cmd.Stdin)
		if err != nil {
			return execx.Result{}, err
		}
		stdin = b
		cmd.Stdin = bytes.NewReader(b)
	}
	rule := f.record(cmd, stdin)
	if rule == nil {
		if f.Next != nil {
			return f.Next.Run(ctx, cmd)
		}
		return execx.Result{}, nil
	}
	res := execx.Result{Stdout: []byte(rule.Stdout), Stderr: []byte(rule.Stderr), ExitCode: rule.ExitCode}
	switch {
	case rule.Err != nil:
		return res, rule.Err
	case rule.ExitCode != 0:
		return res, &execx.ExitError{Cmd: cmd.String(), Code: rule.ExitCode, Stderr: strings.TrimSpace(rule.Stderr)}
	}
	return res, nil
}

func (f *Fake) record(cmd execx.Cmd, stdin []byte) *Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, Call{Cmd: cmd, Stdin: stdin})
	line := cmd.String()
	for i := range f.Rules {
		r := &f.Rules[i]
		if !strings.HasPrefix(line, r.Match) || (r.Times > 0 && r.fired >= r.Times) {
			continue
		}
		r.fired++
		return r
	}
	return nil
}

// Calls returns the recorded calls in order.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Call(nil), f.calls...)
}

// Ran reports how many recorded calls start with the command-line prefix.
func (f *Fake) Ran(prefix string) int {
	n := 0
	for _, c := range f.Calls() {
		if strings.HasPrefix(c.Cmd.String(), prefix) {
			n++
		}
	}
	return n
}
