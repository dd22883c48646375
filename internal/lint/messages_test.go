package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// designSection matches a citation of a numbered section of a design
// document that is not in the repository ("DESIGN §12", "§6.6").
var designSection = regexp.MustCompile(`DESIGN §|§[0-9]`)

// TestMessagesCiteNoMissingDocument: a string of the code outside tests (an
// error, a log line, a flag's help) is read by operators, and the comments
// of producer, the client library, by its users (go doc), who have
// README.md and docs/ but no design document numbered in sections: they
// name a file of docs/ and a heading instead ("docs/operations.md,
// Replication"). Other comments may cite what they like.
func TestMessagesCiteNoMissingDocument(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
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
		if filepath.ToSlash(filepath.Dir(rel)) == "producer" {
			for _, c := range f.Comments {
				if designSection.MatchString(c.Text()) {
					pos := fset.Position(c.Pos())
					t.Errorf("%s:%d: a comment of the client library cites %q, a section of no document its users have (go doc shows it): name a file of docs/ and its heading", filepath.ToSlash(rel), pos.Line, designSection.FindString(c.Text()))
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && designSection.MatchString(lit.Value) {
				pos := fset.Position(lit.Pos())
				t.Errorf("%s:%d: a message cites %q, a section of no document operators have: name a file of docs/ and its heading", filepath.ToSlash(rel), pos.Line, designSection.FindString(lit.Value))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
