// Package clitest checks a program's command table from the outside, as
// an operator meets it: every command's --help exits 0 and lists exactly
// the flags the test expects of it, `help CMD` says the same, and an
// unknown command exits 2 with the list. It is imported by tests only.
package clitest

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/cli"
)

// Run runs the program with args and returns its exit code and output.
type Run func(args ...string) (code int, stdout, stderr string)

// flagLine is a flag in flag.PrintDefaults output ("  -name ...").
var flagLine = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)

// HelpFlags are the flags a help text lists, sorted.
func HelpFlags(help string) []string {
	var names []string
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return names
}

// CheckHelp checks every command of p against want (command name → the
// flags it should take, and no other).
func CheckHelp(t *testing.T, p *cli.Program, run Run, want map[string][]string) {
	t.Helper()
	var names []string
	for _, c := range p.Commands {
		names = append(names, c.Name)
		if _, ok := want[c.Name]; !ok {
			t.Errorf("command %q is in the table but not in the test", c.Name)
		}
	}
	for name := range want {
		if !slices.Contains(names, name) {
			t.Errorf("command %q is in the test but not in the table", name)
		}
	}
	for _, name := range names {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			checkCommand(t, p, run, name, want)
		})
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, _ := run(args...)
		if code != cli.ExitOK {
			t.Errorf("%v: exit %d, want 0", args, code)
		}
		for _, name := range names {
			if !strings.Contains(out, "  "+name) {
				t.Errorf("%v does not list %q:\n%s", args, name, out)
			}
		}
	}
	code, _, errs := run("no-such-command")
	if code != cli.ExitUsage || !strings.Contains(errs, `unknown command "no-such-command"`) || !strings.Contains(errs, "  "+names[0]) {
		t.Errorf("unknown command: exit %d, stderr %q; want 2, the refusal and the list", code, errs)
	}
	code, _, errs = run("help", "no-such-command")
	if code != cli.ExitUsage || !strings.Contains(errs, `unknown command "no-such-command"`) {
		t.Errorf("help of an unknown command: exit %d, stderr %q; want 2", code, errs)
	}
	checkGroups(t, p, run, names)
}

// checkCommand: CMD --help and help CMD exit 0, name the command, and list
// exactly its flags, none of another command's that it does not share.
func checkCommand(t *testing.T, p *cli.Program, run Run, name string, want map[string][]string) {
	args := append(strings.Fields(name), "--help")
	code, out, errs := run(args...)
	if code != cli.ExitOK || errs != "" {
		t.Fatalf("%s --help: exit %d, stderr %q; want 0 and nothing", name, code, errs)
	}
	if !strings.HasPrefix(out, "usage: "+p.Name+" "+name+" ") {
		t.Errorf("%s --help does not start with its usage line:\n%s", name, out)
	}
	got, w := HelpFlags(out), slices.Sorted(slices.Values(want[name]))
	if !slices.Equal(got, w) {
		t.Errorf("%s --help lists flags %v, want %v", name, got, w)
	}
	for other, flags := range want {
		for _, f := range flags {
			if other != name && !slices.Contains(w, f) && slices.Contains(got, f) {
				t.Errorf("%s --help lists -%s, a flag of %s", name, f, other)
			}
		}
	}
	hcode, hout, _ := run(append([]string{"help"}, strings.Fields(name)...)...)
	if hcode != cli.ExitOK || hout != out {
		t.Errorf("help %s: exit %d, output differs from --help:\n%s", name, hcode, hout)
	}
}

// checkGroups: a group's word alone exits 2 with its commands, with
// --help (or under help) it exits 0.
func checkGroups(t *testing.T, p *cli.Program, run Run, names []string) {
	groups := map[string]bool{}
	for _, n := range names {
		if w := strings.Fields(n); len(w) > 1 {
			groups[w[0]] = true
		}
	}
	for g := range groups {
		if code, _, errs := run(g); code != cli.ExitUsage || !strings.Contains(errs, "usage: "+p.Name+" "+g+" COMMAND") {
			t.Errorf("%s alone: exit %d, stderr %q; want 2 and its commands", g, code, errs)
		}
		for _, args := range [][]string{{g, "--help"}, {"help", g}} {
			code, out, _ := run(args...)
			if code != cli.ExitOK || !strings.Contains(out, "usage: "+p.Name+" "+g+" COMMAND") {
				t.Errorf("%v: exit %d, output %q; want 0 and its commands", args, code, out)
			}
			for _, n := range names {
				if strings.HasPrefix(n, g+" ") && !strings.Contains(out, "  "+n) {
					t.Errorf("%v does not list %q", args, n)
				}
			}
		}
	}
}
