// Package sleepcheck refuses new time.Sleep calls in tests. A test that
// sleeps a fixed time to let something happen flakes on a loaded machine
// and wastes time on an idle one; it waits on the condition instead (a
// channel, an event, a poll with a deadline). The polls and the few fixed
// sleeps left are counted per file in scripts/test-sleep-allow.txt; a
// file with more calls than its entry fails the static tier
// (scripts/test.sh), and so does an entry above the file's count, so the
// allowance shrinks with every sleep removed.
//
// It holds no code outside its tests.
package sleepcheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// allowFile is the allow-list, relative to the repository root.
const allowFile = "scripts/test-sleep-allow.txt"

// TestNoNewSleeps checks the repository's test files against the
// allow-list.
func TestNoNewSleeps(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, p := range checkTree(t, root) {
		t.Error(p)
	}
}

// checkTree counts the sleeps under root and compares them with root's
// allow-list.
func checkTree(t *testing.T, root string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, allowFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	allowed, err := parseAllow(f)
	if err != nil {
		t.Fatalf("%s: %v", allowFile, err)
	}
	found, err := scanTree(root)
	if err != nil {
		t.Fatal(err)
	}
	return compare(found, allowed)
}

// scanTree counts the time.Sleep references in every _test.go file under
// root (build tags do not matter: every file is parsed), by path relative
// to root with forward slashes. Hidden directories (.git, .cache) and
// testdata are skipped.
func scanTree(root string) (map[string]int, error) {
	found := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if n := countSleeps(file); n > 0 {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			found[filepath.ToSlash(rel)] = n
		}
		return nil
	})
	return found, err
}

// countSleeps counts the references to the time package's Sleep in file,
// under whatever name file imports "time": a call, or the function taken
// as a value (which a call would go through).
func countSleeps(file *ast.File) int {
	name := ""
	for _, imp := range file.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "time" {
			name = "time"
			if imp.Name != nil {
				name = imp.Name.Name
			}
		}
	}
	if name == "" || name == "_" {
		return 0
	}
	n := 0
	ast.Inspect(file, func(node ast.Node) bool {
		switch x := node.(type) {
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && id.Name == name && x.Sel.Name == "Sleep" {
				n++
			}
		case *ast.Ident:
			if name == "." && x.Name == "Sleep" {
				n++
			}
		}
		return true
	})
	return n
}

// parseAllow reads "path count" lines; # starts a comment. A malformed
// line, a count below one or a path listed twice is an error.
func parseAllow(r io.Reader) (map[string]int, error) {
	out := map[string]int{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 || !strings.HasSuffix(f[0], "_test.go") {
			return nil, fmt.Errorf("line %d: want \"path/to/x_test.go count\", got %q", line, sc.Text())
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 {
			return nil, fmt.Errorf("line %d: count %q is not a positive number", line, f[1])
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("line %d: %s is listed twice", line, f[0])
		}
		out[f[0]] = n
	}
	return out, sc.Err()
}

// compare returns a problem for every file whose count is above its
// allowance and every allowance above its file's count, sorted by path.
func compare(found, allowed map[string]int) []string {
	var out []string
	for path, n := range found {
		if n > allowed[path] {
			out = append(out, fmt.Sprintf("%s: %d time.Sleep calls, %s allows %d: wait on the condition instead "+
				"(a channel, an event, a poll with a deadline; a poll is listed there with its reason)", path, n, allowFile, allowed[path]))
		}
	}
	for path, n := range allowed {
		if found[path] < n {
			out = append(out, fmt.Sprintf("%s: %s allows %d time.Sleep calls, the file has %d: lower the entry (remove it at 0)",
				path, allowFile, n, found[path]))
		}
	}
	slices.Sort(out)
	return out
}

// TestCountFindsEverySleep keeps countSleeps honest: a call, one in a
// loop's post statement, the function as a value, and the package under
// another name are counted; comments, strings and other Sleeps are not.
func TestCountFindsEverySleep(t *testing.T) {
	for _, c := range []struct {
		src  string
		want int
	}{
		{`import "time"
func f() {
	time.Sleep(time.Second) // time.Sleep(1) in a comment
	for ; ; time.Sleep(10 * time.Millisecond) {
	}
	nap := time.Sleep
	_ = "time.Sleep(1)"
	clock.Sleep(1)
	t.Sleep(1)
}`, 3},
		{`import tm "time"
func f() { tm.Sleep(1); time.Sleep(1) }`, 1},
		{`import . "time"
func f() { Sleep(1) }`, 1},
		{`import "fmt"
func f() { time.Sleep(1) }`, 0},
	} {
		file, err := parser.ParseFile(token.NewFileSet(), "x_test.go", "package p\n"+c.src, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := countSleeps(file); got != c.want {
			t.Errorf("%d sleeps in\n%s\nwant %d", got, c.src, c.want)
		}
	}
}

// TestCheckRefusesAddedSleep runs the whole check on a small tree of its
// own: it passes as listed, fails with the file named when a sleep is
// added to a listed file or a new one (a build-tagged one too), and asks
// for the entry to be lowered when a sleep goes.
func TestCheckRefusesAddedSleep(t *testing.T) {
	root := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	test := func(sleeps int) string {
		return "package a\nimport \"time\"\nfunc f() {\n" + strings.Repeat("\ttime.Sleep(1)\n", sleeps) + "}\n"
	}
	write(allowFile, "# reasons\na/x_test.go 1 # a poll\n")
	write("a/x_test.go", test(1))
	write("a/x.go", test(2)) // not a test file
	write("a/testdata/y_test.go", test(1))
	write(".cache/z_test.go", test(1))
	if got := checkTree(t, root); len(got) != 0 {
		t.Fatalf("as listed: %v", got)
	}

	write("a/x_test.go", test(2))
	write("b/new_test.go", "//go:build k8s\n\n"+test(1))
	want := []string{
		"a/x_test.go: 2 time.Sleep calls, scripts/test-sleep-allow.txt allows 1: wait on the condition instead " +
			"(a channel, an event, a poll with a deadline; a poll is listed there with its reason)",
		"b/new_test.go: 1 time.Sleep calls, scripts/test-sleep-allow.txt allows 0: wait on the condition instead " +
			"(a channel, an event, a poll with a deadline; a poll is listed there with its reason)",
	}
	if got := checkTree(t, root); !slices.Equal(got, want) {
		t.Fatalf("sleeps added:\n  %q\nwant\n  %q", got, want)
	}

	write("a/x_test.go", test(0))
	write("b/new_test.go", test(0))
	want = []string{"a/x_test.go: scripts/test-sleep-allow.txt allows 1 time.Sleep calls, the file has 0: lower the entry (remove it at 0)"}
	if got := checkTree(t, root); !slices.Equal(got, want) {
		t.Fatalf("sleep removed:\n  %q\nwant\n  %q", got, want)
	}
}

// TestParseAllowRefusesMalformed: the allow-list is strict.
func TestParseAllowRefusesMalformed(t *testing.T) {
	for in, want := range map[string]string{
		"a/x_test.go 1\na/x_test.go 2\n": "line 2: a/x_test.go is listed twice",
		"a/x_test.go 0\n":                "line 1: count \"0\" is not a positive number",
		"a/x_test.go many\n":             "line 1: count \"many\" is not a positive number",
		"a/x_test.go 1 2\n":              "line 1: want \"path/to/x_test.go count\", got \"a/x_test.go 1 2\"",
		"a/x.go 1\n":                     "line 1: want \"path/to/x_test.go count\", got \"a/x.go 1\"",
	} {
		if _, err := parseAllow(strings.NewReader(in)); err == nil || err.Error() != want {
			t.Errorf("parseAllow(%q) = %v, want %q", in, err, want)
		}
	}
	got, err := parseAllow(strings.NewReader("# c\n\n  a/x_test.go 2 # why\n"))
	if err != nil || len(got) != 1 || got["a/x_test.go"] != 2 {
		t.Errorf("parseAllow = %v, %v", got, err)
	}
}
