package execxtest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/execx"
)

func TestFakeRules(t *testing.T) {
	f := &Fake{Rules: []Rule{
		{Match: "blkid -p", ExitCode: 2, Times: 1},
		{Match: "blkid", Stdout: "TYPE=ext4\n"},
		{Match: "mkfs", Err: errors.New("boom")},
	}}
	ctx := context.Background()
	if _, err := f.Run(ctx, execx.Cmd{Name: "blkid", Args: []string{"-p", "/dev/x"}}); execx.ExitCode(err) != 2 {
		t.Fatalf("first blkid: err = %v, want exit 2", err)
	}
	res, err := f.Run(ctx, execx.Cmd{Name: "blkid", Args: []string{"-p", "/dev/x"}})
	if err != nil || string(res.Stdout) != "TYPE=ext4\n" {
		t.Fatalf("second blkid: %q, %v (the Times:1 rule must be spent)", res.Stdout, err)
	}
	if _, err := f.Run(ctx, execx.Cmd{Name: "mkfs.ext4"}); err == nil || err.Error() != "boom" {
		t.Fatalf("mkfs: err = %v, want boom", err)
	}
	if _, err := f.Run(ctx, execx.Cmd{Name: "true", Stdin: strings.NewReader("key")}); err != nil {
		t.Fatalf("unmatched: %v", err)
	}
	calls := f.Calls()
	if len(calls) != 4 || string(calls[3].Stdin) != "key" || f.Ran("blkid") != 2 {
		t.Fatalf("calls = %+v", calls)
	}
}

func TestFakeNextRunsReal(t *testing.T) {
	f := &Fake{Next: execx.New(execx.Config{Logger: slog.New(slog.DiscardHandler)})}
	res, err := f.Run(context.Background(), execx.Cmd{Name: "cat", Stdin: strings.NewReader("x")})
	if err != nil || string(res.Stdout) != "x" {
		t.Fatalf("passthrough: %q, %v", res.Stdout, err)
	}
}
