// Package gosrctest walks the product's Go source for the static tests
// that hold a vocabulary to one package (log keys to internal/logkey,
// latchkey.io keys to internal/kubekey): both parse every non-test Go
// file under the product's directories and inspect its syntax tree.
//
// Test-only: the shipped binaries must not link it (scripts/test.sh
// checks), and it imports nothing of the product's.
package gosrctest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// Walk parses every non-test .go file under root/dir, in lexical order,
// and calls visit with it; every file shares fset. skipDir, when not nil,
// is asked about each directory below root (its path relative to root)
// and a true answer skips it. A file that does not parse fails t.
func Walk(t testing.TB, root, dir string, skipDir func(rel string) bool, visit func(fset *token.FileSet, file *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel, err := filepath.Rel(root, path)
			if err == nil && skipDir != nil && skipDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		visit(fset, file)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
