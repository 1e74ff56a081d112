package logkey_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/gosrctest"
)

// productDirs are the trees whose non-test code must log with the
// vocabulary's constants.
var productDirs = []string{"agent", "verifier", "attest", "internal", "protocol"}

// attrConstructors are the log/slog functions whose first argument is a key.
var attrConstructors = map[string]bool{
	"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true,
	"Bool": true, "Time": true, "Duration": true, "Any": true, "Group": true,
}

// logMethods are the slog.Logger methods (and package functions) that take
// alternating keys and values or Attrs, each with the index of its first
// key: after the message, and the context and level before it (Log); With
// takes only keys and values.
var logMethods = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "With": 0,
}

// loggerName matches the receivers of slog calls in the tree: the slog
// package, and every logger variable or field (log, logger, Logger,
// logger()). A receiver that does not look like a logger (status.Error,
// err.Error) is not a slog call.
var loggerName = regexp.MustCompile(`(?i)(log|logger)$`)

// finding is one key that is not a logkey constant.
type finding struct {
	pos token.Position
	key string
}

func (f finding) String() string { return fmt.Sprintf("%s: key %s", f.pos, f.key) }

// TestKeysAreConstants fails when non-test code in the product names a log
// key with anything but a constant of package logkey: a string literal, a
// local constant or a variable. One vocabulary means a key is spelled once,
// so a grep of the journal (scripts/vm, docs) finds every line that carries it.
func TestKeysAreConstants(t *testing.T) {
	root := filepath.Join("..", "..")
	var found []finding
	for _, dir := range productDirs {
		found = append(found, scanTree(t, root, dir)...)
	}
	for _, f := range found {
		t.Error(f)
	}
}

func scanTree(t *testing.T, root, dir string) []finding {
	t.Helper()
	var found []finding
	gosrctest.Walk(t, root, dir, nil, func(fset *token.FileSet, file *ast.File) {
		found = append(found, scanFile(fset, file)...)
	})
	return found
}

func scanFile(fset *token.FileSet, file *ast.File) []finding {
	var found []finding
	for _, key := range keyExprs(file) {
		if !isLogkeyConst(key) {
			found = append(found, finding{fset.Position(key.Pos()), exprString(key)})
		}
	}
	slices.SortFunc(found, func(a, b finding) int { return a.pos.Offset - b.pos.Offset })
	return found
}

// keyExprs returns every expression in file that stands where slog takes
// a key: the first argument of an Attr constructor (slog.String), the Key
// of an slog.Attr literal, the keys among the alternating keys and values
// of a Logger method (Info, Log, With, ...), and those of a key-value
// list built for one: a []any literal, or an append to a slice whose name
// ends in attrs.
func keyExprs(file *ast.File) []ast.Expr {
	var keys []ast.Expr
	pairs := func(args []ast.Expr) {
		for i := 0; i < len(args); {
			if isAttr(args[i]) {
				i++
				continue
			}
			keys = append(keys, args[i])
			i += 2
		}
	}
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			switch {
			case isSlogSel(n.Type, "Attr"):
				keys = append(keys, attrLitKey(n)...)
			case isAttrSlice(n.Type):
				for _, e := range n.Elts {
					if cl, ok := e.(*ast.CompositeLit); ok && cl.Type == nil {
						keys = append(keys, attrLitKey(cl)...)
					}
				}
			case isAnySlice(n.Type):
				pairs(n.Elts)
			}
		case *ast.CallExpr:
			args := n.Args
			if n.Ellipsis.IsValid() {
				args = args[:len(args)-1]
			}
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "append" && len(args) > 1 &&
				attrsName.MatchString(receiverName(args[0])) {
				pairs(args[1:])
				return true
			}
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if isSlogSel(sel, "") && attrConstructors[sel.Sel.Name] && len(n.Args) > 0 {
				keys = append(keys, n.Args[0])
				return true
			}
			first, ok := logMethods[sel.Sel.Name]
			if ok && loggerName.MatchString(receiverName(sel.X)) && len(args) > first {
				pairs(args[first:])
			}
		}
		return true
	})
	return keys
}

// attrLitKey is the Key of an slog.Attr literal, if it names one.
func attrLitKey(cl *ast.CompositeLit) []ast.Expr {
	for _, e := range cl.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok && exprString(kv.Key) == "Key" {
			return []ast.Expr{kv.Value}
		}
	}
	return nil
}

// isAttrSlice reports whether e is the type []slog.Attr.
func isAttrSlice(e ast.Expr) bool {
	at, ok := e.(*ast.ArrayType)
	return ok && isSlogSel(at.Elt, "Attr")
}

// attrsName matches the slices key-value lists are built in (attrs).
var attrsName = regexp.MustCompile(`(?i)attrs$`)

func isAnySlice(e ast.Expr) bool {
	at, ok := e.(*ast.ArrayType)
	if !ok || at.Len != nil {
		return false
	}
	switch elt := at.Elt.(type) {
	case *ast.Ident:
		return elt.Name == "any"
	case *ast.InterfaceType:
		return len(elt.Methods.List) == 0
	}
	return false
}

// isAttr reports whether e is visibly an slog.Attr: a call of one of its
// constructors or a composite literal.
func isAttr(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.CallExpr:
		sel, ok := e.Fun.(*ast.SelectorExpr)
		return ok && isSlogSel(sel, "") && attrConstructors[sel.Sel.Name]
	case *ast.CompositeLit:
		return isSlogSel(e.Type, "Attr")
	}
	return false
}

func isSlogSel(e ast.Expr, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "slog" && (name == "" || sel.Sel.Name == name)
}

func isLogkeyConst(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "logkey"
}

// receiverName is the last name of a call's receiver: "log" for
// a.cfg.log and a.log.With(...), "logger" for g.logger().
func receiverName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.CallExpr:
		// log.With(...).Info: the logger With derived.
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "With" || sel.Sel.Name == "WithGroup") {
			return receiverName(sel.X)
		}
		return receiverName(e.Fun)
	}
	return ""
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Value
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return fmt.Sprintf("%T", e)
}

// TestScannerFindsEveryKeyForm keeps TestKeysAreConstants honest: each way
// a key can be written as a literal is found, at its position, and keys
// from logkey, values and messages are not.
func TestScannerFindsEveryKeyForm(t *testing.T) {
	const src = `package p

func f() {
	log.Info("msg", "k1", v, logkey.Node, "value", slog.String("k2", v))
	l.cfg.Logger.Log(ctx, slog.LevelInfo, "msg", slog.Int(logkey.Attempt, 1), "k3", v)
	a.log.With("k4", v).Warn("msg", "k5", "value")
	g.logger().ErrorContext(ctx, "msg", errKey, v)
	attrs := []any{"k6", v, logkey.Result, "accepted"}
	attrs = append(attrs, "k7", v)
	_ = []slog.Attr{{Key: "k8"}, slog.Bool("k9", true), slog.Group("k10")}
	_ = slog.Attr{Key: logkey.Error}
	status.Error(codes.Internal, "not a log call")
	t.Error("not", "a", "log", "call")
	_ = append(args, "--flag", v)
	_ = fmt.Sprint([]string{"x"})
}
`
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range scanFile(fset, file) {
		got = append(got, fmt.Sprintf("%d:%s", f.pos.Line, f.key))
	}
	want := []string{`4:"k1"`, `4:"k2"`, `5:"k3"`, `6:"k4"`, `6:"k5"`, `7:errKey`, `8:"k6"`,
		`9:"k7"`, `10:"k8"`, `10:"k9"`, `10:"k10"`}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("found\n  %v\nwant\n  %v", got, want)
	}
}

// TestOneNamePerConcept fails when two constants spell the same key (a
// synonym under another name) or a key is not lower snake case, the form
// every grep of the journal expects.
func TestOneNamePerConcept(t *testing.T) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "logkey.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
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
			if other, dup := seen[key]; dup {
				t.Errorf("%s and %s are both %q", other, name, key)
			}
			seen[key] = name
			if !snake.MatchString(key) {
				t.Errorf("%s = %q is not lower snake case", name, key)
			}
			if vs.Doc == nil || !strings.HasPrefix(vs.Doc.Text(), name+" ") {
				t.Errorf("%s has no doc comment saying what it holds", name)
			}
		}
	}
	if len(seen) < 50 {
		t.Errorf("read %d keys from logkey.go; the parse missed some", len(seen))
	}
}
