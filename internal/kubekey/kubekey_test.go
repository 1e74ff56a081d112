package kubekey_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/latchkey/latchkey/internal/gosrctest"
)

// productDirs are the trees whose non-test code must name latchkey's
// Kubernetes keys with this package's constants. Tests may spell a key
// out: a test that pins the stored form catches a constant renamed by
// mistake.
var productDirs = []string{"agent", "verifier", "attest", "internal", "protocol", "image"}

// ownDir is this package, the one place the literals live.
var ownDir = filepath.Join("internal", "kubekey")

// domain is what every latchkey key starts with. A literal holding it
// anywhere is found, so a key split over a concatenation
// ("latchkey.io" + "/x") is found too.
const domain = "latchkey.io"

// finding is one string literal that spells a latchkey key.
type finding struct {
	pos   token.Position
	value string
}

func (f finding) String() string { return fmt.Sprintf("%s: literal %s", f.pos, f.value) }

// TestKeysLiveHere fails when non-test product code outside this package
// holds a "latchkey.io" string literal: a second spelling of a key is how
// the node name came to be latchkey.io/name on a Lease and
// latchkey.io/node-name on a Secret.
func TestKeysLiveHere(t *testing.T) {
	root := filepath.Join("..", "..")
	var found []finding
	for _, dir := range productDirs {
		found = append(found, scanTree(t, root, dir)...)
	}
	for _, f := range found {
		t.Errorf("%v: use an internal/kubekey constant", f)
	}
}

func scanTree(t *testing.T, root, dir string) []finding {
	t.Helper()
	var found []finding
	skip := func(rel string) bool { return rel == ownDir || filepath.Base(rel) == "testdata" }
	gosrctest.Walk(t, root, dir, skip, func(fset *token.FileSet, file *ast.File) {
		found = append(found, scanFile(fset, file)...)
	})
	return found
}

// scanFile returns every string literal in file (interpreted or raw) whose
// value holds the domain; comments are not literals.
func scanFile(fset *token.FileSet, file *ast.File) []finding {
	var found []finding
	ast.Inspect(file, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		v, err := strconv.Unquote(lit.Value)
		if err != nil || strings.Contains(v, domain) {
			found = append(found, finding{fset.Position(lit.Pos()), lit.Value})
		}
		return true
	})
	slices.SortFunc(found, func(a, b finding) int { return a.pos.Offset - b.pos.Offset })
	return found
}

// TestScannerFindsEveryLiteral keeps TestKeysLiveHere honest: a key as a
// constant, a map key, a raw string, a selector, split in two or escaped
// is found at its line, and kubekey constants, comments and other
// strings are not.
func TestScannerFindsEveryLiteral(t *testing.T) {
	const src = "package p\n" + `
// latchkey.io/comment is not a literal.
const own = "latchkey.io/own"
var m = map[string]string{"latchkey.io/map": v, kubekey.LabelRole: "worker"}
var raw = ` + "`latchkey.io/raw`" + `
var sel = metav1.ListOptions{LabelSelector: "latchkey.io/binding=node"}
var split = "latchkey.io" + "/split"
var esc = "latchkey\x2eio/escaped"
var other = []string{"app.kubernetes.io/name", "latchkey", "io/x"}
`
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range scanFile(fset, file) {
		got = append(got, fmt.Sprintf("%d:%s", f.pos.Line, f.value))
	}
	want := []string{`4:"latchkey.io/own"`, `5:"latchkey.io/map"`, "6:`latchkey.io/raw`",
		`7:"latchkey.io/binding=node"`, `8:"latchkey.io"`, `9:"latchkey\x2eio/escaped"`}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("found\n  %v\nwant\n  %v", got, want)
	}
}

// TestOneKeyPerConcept fails when two constants spell the same key, a key
// is not a valid Kubernetes qualified name, a latchkey key is outside the
// latchkey.io prefix, or a constant has no doc comment saying what it
// holds.
func TestOneKeyPerConcept(t *testing.T) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "kubekey.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, d := range file.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			name := vs.Names[0].Name
			key, err := strconv.Unquote(vs.Values[0].(*ast.BasicLit).Value)
			if err != nil {
				t.Fatal(err)
			}
			if vs.Doc == nil || !strings.HasPrefix(vs.Doc.Text(), name+" ") {
				t.Errorf("%s has no doc comment saying what it holds", name)
			}
			if name == "ManagedBy" { // a value, not a key
				continue
			}
			if other, dup := seen[key]; dup {
				t.Errorf("%s and %s are both %q", other, name, key)
			}
			seen[key] = name
			if errs := validation.IsQualifiedName(key); len(errs) > 0 {
				t.Errorf("%s = %q is not a Kubernetes key: %v", name, key, errs)
			}
			if name != "LabelManagedBy" && !strings.HasPrefix(key, domain+"/") {
				t.Errorf("%s = %q is not under %s/", name, key, domain)
			}
		}
	}
	if len(seen) < 20 {
		t.Errorf("read %d keys from kubekey.go; the parse missed some", len(seen))
	}
}
