// Command metrics prints the mechanical code-health figures of a Go tree,
// so that they can be measured the same way before and after a change, and
// on other projects for comparison: the number of functions, the median
// function length, the functions over 60 lines, the share of exported
// identifiers without a doc comment, init functions, fmt.Errorf calls that
// pass an error without %w, and Go files over 500 lines.
//
//	go run ./scripts/metrics [DIR]
//
// It reads the source with go/parser only (no type checking, so it runs on
// any checkout, built or not) and skips _test.go files, generated *.pb.go
// files, testdata, vendor and hidden directories. The import direction is
// checked by scripts/layercheck; dead code by scripts/deadcode.sh.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

const (
	longFunc = 60  // a function over this many lines is listed
	longFile = 500 // a file over this many lines is listed

	// duplicatesCmd counts repeated code over the same files this program
	// reads: duplicates reads whatever git tracks, so it is given a copy of
	// the non-test, non-generated Go files. Run from the tree's root.
	duplicatesCmd = `d=$(mktemp -d) && git ls-files -- '*.go' ':!:*_test.go' ':!:*.pb.go' ':!:**/testdata/**' | xargs cp --parents -t "$d" && duplicates --repo "$d" --seconds 120`
)

// funcLen is one function declaration and its length in lines.
type funcLen struct {
	where string
	lines int
}

// figures accumulates the counts over every file read.
type figures struct {
	funcs         []funcLen
	exported      int
	undocumented  int
	inits         int
	errorfWithErr int
	errorfNoWrap  []string
	longFiles     []string
}

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	f, err := measure(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
	f.print(os.Stdout)
}

// measure parses every counted Go file below dir.
func measure(dir string) (*figures, error) {
	f := &figures{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !counted(d.Name()) {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		f.addFile(fset, file, rel)
		return nil
	})
	return f, err
}

// skipDir says whether a directory holds no counted code: test data,
// vendored copies, and hidden directories such as .git.
func skipDir(name string) bool {
	return name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// counted says whether a file is hand-written, non-test Go source.
func counted(name string) bool {
	return strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") && !strings.HasSuffix(name, ".pb.go")
}

// addFile adds one parsed file's figures.
func (f *figures) addFile(fset *token.FileSet, file *ast.File, rel string) {
	if n := fset.File(file.Pos()).LineCount(); n > longFile {
		f.longFiles = append(f.longFiles, fmt.Sprintf("%s (%d lines)", rel, n))
	}
	for _, decl := range file.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			f.addFunc(fset, d, rel)
		case *ast.GenDecl:
			f.addGenDecl(d)
		}
	}
	ast.Inspect(file, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			f.addCall(fset, call, rel)
		}
		return true
	})
}

// addFunc counts a function or method: its length, whether it is init, and
// whether it is exported without a doc comment.
func (f *figures) addFunc(fset *token.FileSet, d *ast.FuncDecl, rel string) {
	lines := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
	f.funcs = append(f.funcs, funcLen{where: fmt.Sprintf("%s:%d %s", rel, fset.Position(d.Pos()).Line, funcName(d)), lines: lines})
	if d.Recv == nil && d.Name.Name == "init" {
		f.inits++
	}
	if d.Name.IsExported() && receiverExported(d) {
		f.countExport(d.Doc)
	}
}

// funcName is Name for a function and Type.Name for a method.
func funcName(d *ast.FuncDecl) string {
	if t := receiverType(d); t != "" {
		return t + "." + d.Name.Name
	}
	return d.Name.Name
}

// receiverType is the name of a method's receiver type, "" for a function.
func receiverType(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	t := d.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return "?"
		}
	}
}

// receiverExported says whether a method's receiver type is exported; a
// method of an unexported type is not part of any package's API. A
// function counts as exported receiver-wise.
func receiverExported(d *ast.FuncDecl) bool {
	t := receiverType(d)
	return t == "" || ast.IsExported(t)
}

// addGenDecl counts the exported types, constants and variables of a
// declaration; a spec inside a parenthesised group is documented by its
// own comment or by the group's.
func (f *figures) addGenDecl(d *ast.GenDecl) {
	for _, spec := range d.Specs {
		switch s := spec.(type) {
		case *ast.TypeSpec:
			if s.Name.IsExported() {
				f.countExport(firstDoc(s.Doc, d.Doc))
			}
		case *ast.ValueSpec:
			for _, name := range s.Names {
				if name.IsExported() {
					f.countExport(firstDoc(s.Doc, d.Doc))
				}
			}
		}
	}
}

// firstDoc is the spec's own doc comment, else the group's.
func firstDoc(spec, group *ast.CommentGroup) *ast.CommentGroup {
	if spec != nil {
		return spec
	}
	return group
}

// countExport counts one exported identifier and whether it lacks a doc.
func (f *figures) countExport(doc *ast.CommentGroup) {
	f.exported++
	if doc == nil || strings.TrimSpace(doc.Text()) == "" {
		f.undocumented++
	}
}

// addCall counts a fmt.Errorf call that passes an error argument, and
// lists it when its format has no %w. Without type information an
// argument is taken to be an error when its name (the last part of a
// selector) is err or ends in Err; a format that is not a string literal
// is not judged.
func (f *figures) addCall(fset *token.FileSet, call *ast.CallExpr, rel string) {
	if !isErrorf(call) || len(call.Args) < 2 {
		return
	}
	format, ok := call.Args[0].(*ast.BasicLit)
	if !ok || format.Kind != token.STRING || !hasErrArg(call.Args[1:]) {
		return
	}
	f.errorfWithErr++
	if !strings.Contains(format.Value, "%w") {
		f.errorfNoWrap = append(f.errorfNoWrap, fmt.Sprintf("%s:%d", rel, fset.Position(call.Pos()).Line))
	}
}

// isErrorf says whether a call is fmt.Errorf (by the package's usual name).
func isErrorf(call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Errorf" {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "fmt"
}

// hasErrArg says whether an argument is named like an error.
func hasErrArg(args []ast.Expr) bool {
	for _, a := range args {
		var name string
		switch x := a.(type) {
		case *ast.Ident:
			name = x.Name
		case *ast.SelectorExpr:
			name = x.Sel.Name
		}
		if name == "err" || strings.HasSuffix(name, "Err") {
			return true
		}
	}
	return false
}

// print writes the figures, one a line, the lists indented below.
func (f *figures) print(w *os.File) {
	sort.Slice(f.funcs, func(i, j int) bool { return f.funcs[i].lines > f.funcs[j].lines })
	fmt.Fprintf(w, "functions: %d\n", len(f.funcs))
	fmt.Fprintf(w, "median function length (lines): %s\n", median(f.funcs))
	long := longFuncs(f.funcs)
	fmt.Fprintf(w, "functions over %d lines: %d\n", longFunc, len(long))
	printList(w, long)
	fmt.Fprintf(w, "exported identifiers without a doc comment: %d of %d (%s)\n", f.undocumented, f.exported, percent(f.undocumented, f.exported))
	fmt.Fprintf(w, "init functions: %d\n", f.inits)
	fmt.Fprintf(w, "fmt.Errorf with an error argument but no %%w: %d of %d (an argument named err or ending in Err, literal formats only)\n", len(f.errorfNoWrap), f.errorfWithErr)
	printList(w, f.errorfNoWrap)
	sort.Strings(f.longFiles)
	fmt.Fprintf(w, "Go files over %d lines: %d\n", longFile, len(f.longFiles))
	printList(w, f.longFiles)
	fmt.Fprintln(w, "not counted here (see docs/benchmarks.md, Code health):")
	fmt.Fprintln(w, "  dead functions outside the allow-list: scripts/deadcode.sh")
	fmt.Fprintln(w, "  import direction: go test ./scripts/layercheck")
	fmt.Fprintln(w, "  duplicated code: "+duplicatesCmd)
}

// median is the middle function length, the mean of the two middle ones
// for an even count; funcs is sorted.
func median(funcs []funcLen) string {
	n := len(funcs)
	switch {
	case n == 0:
		return "-"
	case n%2 == 1:
		return fmt.Sprint(funcs[n/2].lines)
	}
	sum := funcs[n/2-1].lines + funcs[n/2].lines
	if sum%2 == 0 {
		return fmt.Sprint(sum / 2)
	}
	return fmt.Sprintf("%d.5", sum/2)
}

// longFuncs lists the functions over longFunc lines, longest first.
func longFuncs(funcs []funcLen) []string {
	var out []string
	for _, fn := range funcs {
		if fn.lines > longFunc {
			out = append(out, fmt.Sprintf("%s (%d lines)", fn.where, fn.lines))
		}
	}
	return out
}

// percent is part of whole as a percentage with one decimal.
func percent(part, whole int) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f %%", 100*float64(part)/float64(whole))
}

// printList writes each item on its own indented line.
func printList(w *os.File, items []string) {
	for _, it := range items {
		fmt.Fprintln(w, "  "+it)
	}
}
