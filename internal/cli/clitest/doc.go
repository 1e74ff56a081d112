package clitest

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/cli"
)

// CheckDocCommands checks every line of the markdown file's sh code
// blocks that runs p (its name first) with p.Check, and returns how many
// it checked. Shell syntax after the command (a redirection, a pipe, a
// comment) ends it; double-quoted words stay one argument.
func CheckDocCommands(t *testing.T, p *cli.Program, markdown string) int {
	t.Helper()
	f, err := os.Open(markdown)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, inSh := 0, false
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(text, "```"):
			inSh = !inSh && text == "```sh"
			continue
		case !inSh:
			continue
		}
		words := ShellWords(text)
		if len(words) == 0 || words[0] != p.Name {
			continue
		}
		n++
		if err := p.Check(words[1:]); err != nil {
			t.Errorf("%s:%d: %q: %v", markdown, line, text, err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// ShellWords splits a simple shell command line into words, up to the
// first redirection, pipe, list operator or comment. Double and single
// quotes group; what they hold is kept as written (no expansion).
func ShellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words, inWord = append(words, cur.String()), false
				cur.Reset()
			}
		case !inWord && strings.ContainsRune("#>|&;<", r):
			return words
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
