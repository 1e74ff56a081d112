package cli

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
)

// testProgram has a default command, a group and a command taking two of
// a larger group's flags.
func testProgram(ran *[]string) *Program {
	record := func(name string) Runner {
		return func(args []string, _, _ io.Writer) int {
			*ran = append(*ran, name+" "+strings.Join(args, ","))
			return 0
		}
	}
	return &Program{Name: "prog", Default: "run", Commands: []Command{
		{Name: "run", Summary: "the default", Flags: func(fs *flag.FlagSet) Runner {
			fs.Bool("wipe", false, "destroy")
			return record("run")
		}},
		{Name: "grp a", Args: "FILE", Summary: "first", Flags: func(fs *flag.FlagSet) Runner {
			all := flag.NewFlagSet("", flag.ContinueOnError)
			all.String("x", "", "")
			all.String("y", "", "")
			all.String("z", "", "")
			CopyFlags(fs, all, "x", "z")
			return record("grp a")
		}},
		{Name: "grp b", Summary: "second", Flags: func(*flag.FlagSet) Runner { return record("grp b") }},
	}}
}

func TestProgramDispatch(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		ran    string
		out    string // in stdout
		errs   string // in stderr
		notOut string
	}{
		{args: nil, ran: "run "},
		{args: []string{"--wipe"}, ran: "run "},
		{args: []string{"grp", "a", "--x", "1", "f"}, ran: "grp a f"},
		{args: []string{"grp", "a", "--y", "1"}, code: ExitUsage, errs: "flag provided but not defined: -y"},
		{args: []string{"grp", "a", "--help"}, out: "usage: prog grp a [flags] FILE", notOut: "-y"},
		{args: []string{"help", "grp", "a"}, out: "  -z", notOut: "-wipe"},
		{args: []string{"grp"}, code: ExitUsage, errs: "usage: prog grp COMMAND"},
		{args: []string{"grp", "--help"}, out: "  grp b", notOut: "  run"},
		{args: []string{"grp", "c"}, code: ExitUsage, errs: `unknown command "grp c"`},
		{args: []string{"nope"}, code: ExitUsage, errs: `unknown command "nope"`},
		{args: []string{"help"}, out: "  grp a FILE"},
		{args: []string{"help", "nope"}, code: ExitUsage, errs: `unknown command "nope"`},
	} {
		var ran []string
		var out, errs bytes.Buffer
		code := testProgram(&ran).Main(tc.args, &out, &errs)
		got := strings.Join(ran, ";")
		if code != tc.code || got != tc.ran || !strings.Contains(out.String(), tc.out) || !strings.Contains(errs.String(), tc.errs) ||
			(tc.notOut != "" && strings.Contains(out.String(), tc.notOut)) {
			t.Errorf("%q: exit %d, ran %q, stdout %q, stderr %q", tc.args, code, got, out.String(), errs.String())
		}
	}
}
