package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Runner runs a command with the arguments left after its flags.
type Runner func(args []string, stdout, stderr io.Writer) int

// Command is one row of a program's command table. Help, usage lines and
// flag lists are all generated from the table, so a command's --help
// shows exactly the flags it registers and nothing of its neighbours'.
type Command struct {
	// Name is the command's words, e.g. "policy check".
	Name string
	// Args names the positional arguments, e.g. "FILE" ("" for none).
	Args string
	// Summary is one line for the program's command list.
	Summary string
	// Flags registers the command's own flags on fs and returns what
	// runs it. It is also called (and the Runner dropped) to print help.
	Flags func(fs *flag.FlagSet) Runner
}

// Program is a binary's command table.
type Program struct {
	// Name is the binary's name, e.g. "latchkey-agent".
	Name string
	// Default is the command run when the arguments start with a flag
	// or are empty ("" means a command must be named).
	Default string
	// Commands is the table, in the order help lists it.
	Commands []Command
	// Footer is printed after the command list (may be empty).
	Footer string
}

// isHelp reports whether a is one of the ways to ask for help.
func isHelp(a string) bool {
	return a == "-h" || a == "-help" || a == "--help" || a == "help"
}

// Main dispatches args: "help [CMD...]" and "--help" print help and exit
// 0; a command group without its subcommand, or an unknown command,
// prints the list and exits ExitUsage.
func (p *Program) Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "help" {
		return p.help(args[1:], stdout, stderr)
	}
	if len(args) == 1 && isHelp(args[0]) {
		p.WriteUsage(stdout, "")
		return ExitOK
	}
	if (len(args) == 0 || strings.HasPrefix(args[0], "-")) && p.Default != "" {
		args = append(strings.Fields(p.Default), args...)
	}
	if len(args) == 0 {
		p.WriteUsage(stderr, "")
		return ExitUsage
	}
	c, rest := p.find(args)
	if c == nil {
		return p.group(args, stdout, stderr)
	}
	return p.runCommand(c, rest, stdout, stderr)
}

// find returns the command whose words lead args (the longest match), and
// the arguments after them.
func (p *Program) find(args []string) (*Command, []string) {
	var best *Command
	n := 0
	for i := range p.Commands {
		w := strings.Fields(p.Commands[i].Name)
		if len(w) > n && len(w) <= len(args) && slices.Equal(w, args[:len(w)]) {
			best, n = &p.Commands[i], len(w)
		}
	}
	return best, args[n:]
}

// group handles words that name no command: a group's prefix lists its
// commands (exit 0 when help was asked for), anything else is unknown.
func (p *Program) group(args []string, stdout, stderr io.Writer) int {
	prefix := ""
	for _, a := range args {
		if strings.HasPrefix(a, "-") || !p.hasPrefix(prefix+a+" ") {
			break
		}
		prefix += a + " "
	}
	words := len(strings.Fields(prefix))
	if prefix == "" {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n", p.Name, args[0])
		p.WriteUsage(stderr, "")
		return ExitUsage
	}
	if len(args) > words && isHelp(args[words]) {
		p.WriteUsage(stdout, prefix)
		return ExitOK
	}
	if len(args) > words {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n", p.Name, strings.TrimSpace(prefix)+" "+args[words])
	}
	p.WriteUsage(stderr, prefix)
	return ExitUsage
}

func (p *Program) hasPrefix(prefix string) bool {
	for _, c := range p.Commands {
		if strings.HasPrefix(c.Name+" ", prefix) {
			return true
		}
	}
	return false
}

// help is "help [CMD...]".
func (p *Program) help(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		p.WriteUsage(stdout, "")
		return ExitOK
	}
	c, rest := p.find(args)
	if c == nil || len(rest) > 0 {
		return p.group(append(args, "--help"), stdout, stderr)
	}
	fs := p.flagSet(c)
	c.Flags(fs)
	p.writeCommandHelp(stdout, c, fs)
	return ExitOK
}

func (p *Program) flagSet(c *Command) *flag.FlagSet {
	return flag.NewFlagSet(p.Name+" "+c.Name, flag.ContinueOnError)
}

// runCommand parses c's flags and runs it. --help prints to stdout and
// exits 0; a flag error prints the error and the help to stderr.
func (p *Program) runCommand(c *Command, args []string, stdout, stderr io.Writer) int {
	fs := p.flagSet(c)
	run := c.Flags(fs)
	var msg bytes.Buffer
	fs.SetOutput(&msg)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		p.writeCommandHelp(stdout, c, fs)
		return ExitOK
	case err != nil:
		stderr.Write(msg.Bytes())
		p.writeCommandHelp(stderr, c, fs)
		return ExitUsage
	}
	fs.SetOutput(stderr)
	return run(fs.Args(), stdout, stderr)
}

// Usage is a command's usage line: "usage: PROG CMD [flags] ARGS".
func (p *Program) Usage(name string) string {
	for _, c := range p.Commands {
		if c.Name == name {
			return p.usageLine(&c)
		}
	}
	return "usage: " + p.Name + " " + name
}

func (p *Program) usageLine(c *Command) string {
	line := "usage: " + p.Name + " " + c.Name + " [flags]"
	if c.Args != "" {
		line += " " + c.Args
	}
	return line
}

func (p *Program) writeCommandHelp(w io.Writer, c *Command, fs *flag.FlagSet) {
	fmt.Fprintln(w, p.usageLine(c))
	if c.Summary != "" {
		fmt.Fprintf(w, "\n%s\n", c.Summary)
	}
	has := false
	fs.VisitAll(func(*flag.Flag) { has = true })
	if has {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

// WriteUsage lists the commands whose name starts with prefix ("" for
// all) with their summaries.
func (p *Program) WriteUsage(w io.Writer, prefix string) {
	fmt.Fprintf(w, "usage: %s %sCOMMAND [flags]\n\ncommands:\n", p.Name, prefix)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range p.Commands {
		if !strings.HasPrefix(c.Name+" ", prefix) {
			continue
		}
		name := c.Name
		if c.Args != "" {
			name += " " + c.Args
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, c.Summary)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n\"%s help COMMAND\" or \"%s COMMAND --help\" lists a command's flags.\n", p.Name, p.Name)
	if p.Footer != "" && prefix == "" {
		fmt.Fprintln(w, p.Footer)
	}
}

// FlagNames are the names of the flags registered on fs, sorted.
func FlagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// CopyFlags registers on dst the flags of src named in names (sharing
// their values), so a command can take a subset of a larger flag group
// without listing the rest in its help.
func CopyFlags(dst, src *flag.FlagSet, names ...string) {
	for _, n := range names {
		f := src.Lookup(n)
		if f == nil {
			panic("cli: no flag " + n) // a table bug, found by every test
		}
		dst.Var(f.Value, f.Name, f.Usage)
	}
}

// Check parses args as the program would (command words, then that
// command's flags) without running anything: a documented command line
// that names a removed command or flag, or gives arguments to a command
// that takes none, is an error.
func (p *Program) Check(args []string) error {
	if len(args) > 0 && args[0] == "help" {
		return nil
	}
	if (len(args) == 0 || strings.HasPrefix(args[0], "-")) && p.Default != "" {
		args = append(strings.Fields(p.Default), args...)
	}
	c, rest := p.find(args)
	if c == nil {
		return fmt.Errorf("%s: no command %q", p.Name, strings.Join(args, " "))
	}
	fs := p.flagSet(c)
	c.Flags(fs)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(rest); err != nil {
		return fmt.Errorf("%s %s: %w", p.Name, c.Name, err)
	}
	if c.Args == "" && fs.NArg() > 0 {
		return fmt.Errorf("%s %s takes no arguments, got %q", p.Name, c.Name, fs.Args())
	}
	return nil
}
