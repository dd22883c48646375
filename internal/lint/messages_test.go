package lint

import (
	"fmt"
	"go/ast"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// designSection matches a citation of a numbered section of a design
// document that is not in the repository ("DESIGN §12", "§6.6").
var designSection = regexp.MustCompile(`DESIGN §|§[0-9]`)

// docCitation matches a citation of a file of docs/, with the heading that
// may follow it after a comma ("docs/operations.md, Replication").
var docCitation = regexp.MustCompile(`docs/([a-z-]+)\.md(?:, ([A-Z][^,;:()"\x60]*[^,;:()"\x60 .]))?`)

// headings returns the headings of every file of docs/, by file name.
func headings(t *testing.T, root string) map[string]map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		hs := map[string]bool{}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "#") {
				hs[strings.TrimSpace(strings.TrimLeft(l, "#"))] = true
			}
		}
		out[strings.TrimSuffix(filepath.Base(f), ".md")] = hs
	}
	if len(out) == 0 {
		t.Fatal("no file in docs/")
	}
	return out
}

// citationProblems returns what is wrong with the citations of text: a
// section of a design document the repository does not hold, a file of
// docs/ that does not exist, or a heading the file does not have.
func citationProblems(text string, docs map[string]map[string]bool) []string {
	text = strings.Join(strings.Fields(text), " ")
	var out []string
	if m := designSection.FindString(text); m != "" {
		out = append(out, fmt.Sprintf("cites %q, a section of no document in the repository: name a file of docs/ and its heading", m))
	}
	for _, m := range docCitation.FindAllStringSubmatch(text, -1) {
		hs, ok := docs[m[1]]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("cites docs/%s.md, which does not exist", m[1]))
		case m[2] != "" && !hs[m[2]]:
			out = append(out, fmt.Sprintf("cites docs/%s.md, %s: the file has no such heading", m[1], m[2]))
		}
	}
	return out
}

// TestMessagesCiteNoMissingDocument: a string of the code outside tests (an
// error, a log line, a flag's help) is read by operators, and the comments
// of producer, the client library, by its users (go doc), who have
// README.md and docs/ but no design document numbered in sections: they
// name a file of docs/ and a heading instead ("docs/operations.md,
// Replication"), which must exist. Other comments may cite what they like.
func TestMessagesCiteNoMissingDocument(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	docs := headings(t, root)
	goFiles(t, root, func(rel string, fset *token.FileSet, f *ast.File) {
		if path.Dir(rel) == "producer" {
			for _, c := range f.Comments {
				for _, p := range citationProblems(c.Text(), docs) {
					t.Errorf("%s:%d: a comment of the client library (go doc shows it) %s", rel, fset.Position(c.Pos()).Line, p)
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				for _, p := range citationProblems(lit.Value, docs) {
					t.Errorf("%s:%d: a message %s", rel, fset.Position(lit.Pos()).Line, p)
				}
			}
			return true
		})
	})
}

// TestCitationProblems: the citations found and judged.
func TestCitationProblems(t *testing.T) {
	docs := map[string]map[string]bool{"operations": {"Dedup keys": true, "Replication": true}}
	for text, want := range map[string]int{
		"see docs/operations.md, Dedup keys":                       0,
		"(docs/operations.md, Replication).":                       0,
		"(docs/operations.md)":                                     0,
		"see docs/operations.md,\n\tDedup keys, then":              0,
		"see docs/operations.md, Rotation":                         1,
		"(docs/security.md)":                                       1,
		"(DESIGN §12)":                                             1,
		"docs/operations.md, Rotation; docs/nope.md, Topics, §6.4": 3,
	} {
		if got := citationProblems(text, docs); len(got) != want {
			t.Errorf("%q: %d problems %v, want %d", text, len(got), got, want)
		}
	}
}
