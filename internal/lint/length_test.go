package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// maxFunctionLines is the most lines a function outside tests may span,
// from its func keyword to its closing brace.
const maxFunctionLines = 120

// longFunctions are the functions allowed to be longer, by
// "<directory>.<name>" (a method: "<directory>.<Type>.<name>"), each with
// the reason. A reason is a declaration: a table, a schema, a list of
// flags; logic is split by concern instead.
var longFunctions = map[string]string{
	"sink.newTables": "declarative: the ClickHouse tables the sink writes, one literal per table with its columns and encoders",
}

// function is one function declaration of a non-test file.
type function struct {
	key   string // "<directory>.<name>" or "<directory>.<Type>.<name>"
	where string // file:line
	lines int
	fn    *ast.FuncDecl // its declaration, with its doc comment
}

// goFiles parses every non-test Go file below root (skipping testdata,
// vendor and hidden directories), with its comments, and calls fn with its
// path relative to root, in slashes.
func goFiles(t *testing.T, root string, fn func(rel string, fset *token.FileSet, f *ast.File)) {
	t.Helper()
	walkGoFiles(t, root, false, fn)
}

// walkGoFiles is goFiles, with the _test.go files too when tests is set.
func walkGoFiles(t *testing.T, root string, tests bool, fn func(rel string, fset *token.FileSet, f *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || (!tests && strings.HasSuffix(path, "_test.go")) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fn(filepath.ToSlash(rel), fset, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// functions returns the function declarations of every non-test Go file
// below root.
func functions(t *testing.T, root string) []function {
	t.Helper()
	var out []function
	goFiles(t, root, func(rel string, fset *token.FileSet, f *ast.File) {
		dir := path.Dir(rel)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
			out = append(out, function{
				key:   dir + "." + funcName(fn),
				where: rel + ":" + strconv.Itoa(start.Line),
				lines: end.Line - start.Line + 1,
				fn:    fn,
			})
		}
	})
	return out
}

// funcName is a function's name, with its receiver's type for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fn.Name.Name
	}
}

// TestFunctionLength: no function outside tests spans more than 120 lines
// unless longFunctions lists it with a reason; and every entry of
// longFunctions is still a long function (a split one leaves the list).
func TestFunctionLength(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	fns := functions(t, root)
	if len(fns) < 100 {
		t.Fatalf("read %d functions below %s; the walk is broken", len(fns), root)
	}
	sort.Slice(fns, func(i, j int) bool { return fns[i].lines > fns[j].lines })
	long := map[string]bool{}
	for _, f := range fns {
		if f.lines <= maxFunctionLines {
			break
		}
		long[f.key] = true
		if _, ok := longFunctions[f.key]; ok {
			t.Logf("%s (%s): %d lines, allowed: %s", f.key, f.where, f.lines, longFunctions[f.key])
			continue
		}
		t.Errorf("%s (%s) spans %d lines, more than %d: split it by concern, or list it in longFunctions with the reason it is declarative",
			f.key, f.where, f.lines, maxFunctionLines)
	}
	for key := range longFunctions {
		if !long[key] {
			t.Errorf("longFunctions lists %s, which is no longer over %d lines (or no longer exists): take it off the list", key, maxFunctionLines)
		}
	}
}
