package lint

import (
	"fmt"
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// designSection matches a citation of a numbered section of a design
// document that is not in the repository: the word DESIGN and a section
// sign, or a section sign and a number.
var designSection = regexp.MustCompile(`DESIGN §|§[0-9]`)

// docCitation matches a citation of a file of docs/, with the heading that
// may follow it after a comma ("docs/operations.md, Replication"). The
// heading ends at a comma, a semicolon, a colon or a parenthesis, unless a
// heading of the file that holds one of these follows there whole
// (citationProblems).
var docCitation = regexp.MustCompile(`docs/([a-z-]+)\.md(?:, ([A-Z][^,;:()"\x60]*[^,;:()"\x60 .]))?`)

// rootDocument matches the name of a document cited bare, as at the top
// of the repository: capitals and ".md" ("README.md"), not after a slash
// or a word character ("docs/README.md" is judged by docCitation).
var rootDocument = regexp.MustCompile(`(?:^|[^/\w.])([A-Z][A-Z0-9_-]*\.md)\b`)

// rootDocuments returns the names of the files of root that rootDocument
// matches (README.md, CHANGELOG.md).
func rootDocuments(t *testing.T, root string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range files {
		out[filepath.Base(f)] = true
	}
	return out
}

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
// section of a design document the repository does not hold, a document
// named bare (capitals and ".md") that is not one of rootDocs, the files
// at the top of the repository, a file of docs/ that does not exist, or a
// heading the file does not have.
func citationProblems(text string, docs map[string]map[string]bool, rootDocs map[string]bool) []string {
	text = strings.Join(strings.Fields(text), " ")
	var out []string
	if m := designSection.FindString(text); m != "" {
		out = append(out, fmt.Sprintf("cites %q, a section of no document in the repository: name a file of docs/ and its heading", m))
	}
	for _, m := range rootDocument.FindAllStringSubmatch(text, -1) {
		if !rootDocs[m[1]] {
			out = append(out, fmt.Sprintf("cites %s, a document the repository does not hold: name a file of docs/ and its heading, or say it", m[1]))
		}
	}
	for _, m := range docCitation.FindAllStringSubmatchIndex(text, -1) {
		file := text[m[2]:m[3]]
		hs, ok := docs[file]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("cites docs/%s.md, which does not exist", file))
		case m[4] >= 0 && !hs[text[m[4]:m[5]]] && !headingAt(text[m[4]:], hs):
			out = append(out, fmt.Sprintf("cites docs/%s.md, %s: the file has no such heading", file, text[m[4]:m[5]]))
		}
	}
	return out
}

// headingAt reports whether text begins with one of the headings hs, whole:
// followed by the end of the text or by punctuation, so that a heading
// holding a comma or a colon ("Health, metrics and logs") can be cited.
func headingAt(text string, hs map[string]bool) bool {
	for h := range hs {
		if rest, ok := strings.CutPrefix(text, h); ok && (rest == "" || strings.ContainsRune(",;:().\"`", rune(rest[0]))) {
			return true
		}
	}
	return false
}

// TestMessagesCiteNoMissingDocument: a string of the code outside tests (an
// error, a log line, a flag's help) is read by operators, who have
// README.md and docs/ but no design document numbered in sections: it
// names a file of docs/ and a heading instead ("docs/operations.md,
// Replication"), which must exist.
func TestMessagesCiteNoMissingDocument(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	docs, rootDocs := headings(t, root), rootDocuments(t, root)
	goFiles(t, root, func(rel string, fset *token.FileSet, f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				for _, p := range citationProblems(lit.Value, docs, rootDocs) {
					t.Errorf("%s:%d: a message %s", rel, fset.Position(lit.Pos()).Line, p)
				}
			}
			return true
		})
	})
}

// TestCommentsCiteNoMissingDocument: the comments of every Go file, tests
// included, are read by users of the client library (go doc) and by
// whoever works on the code, who have README.md and docs/ but no design
// document numbered in sections: a comment names a file of docs/ and a
// heading instead ("docs/design.md, Exactly-once"), which must exist.
func TestCommentsCiteNoMissingDocument(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	docs, rootDocs := headings(t, root), rootDocuments(t, root)
	walkGoFiles(t, root, true, func(rel string, fset *token.FileSet, f *ast.File) {
		for _, c := range f.Comments {
			for _, p := range citationProblems(c.Text(), docs, rootDocs) {
				t.Errorf("%s:%d: a comment %s", rel, fset.Position(c.Pos()).Line, p)
			}
		}
	})
}

// TestCitationProblems: the citations found and judged.
func TestCitationProblems(t *testing.T) {
	docs := map[string]map[string]bool{"operations": {"Dedup keys": true, "Replication": true, "Health, metrics and logs": true, "Kafka: SASL and TLS": true}}
	for text, want := range map[string]int{
		"see docs/operations.md, Dedup keys":                       0,
		"(docs/operations.md, Replication).":                       0,
		"(docs/operations.md)":                                     0,
		"see docs/operations.md,\n\tDedup keys, then":              0,
		"see docs/operations.md, Rotation":                         1,
		"(docs/security.md)":                                       1,
		"(DESIGN §12)":                                             1,
		"docs/operations.md, Rotation; docs/nope.md, Topics, §6.4": 3,
		"(docs/operations.md, Health, metrics and logs)":           0,
		"docs/operations.md, Health, metrics and logs, lists":      0,
		"(docs/operations.md, Kafka: SASL and TLS)":                0,
		"(docs/operations.md, Health)":                             1,
		"(docs/operations.md, Health, metrics)":                    1,
		"(docs/operations.md, Replication. Then more, text)":       0,
		"(docs/operations.md, Replication and more)":               1,
		"must carry a deadline (PLATFORM.md).":                     1,
		"see STYLE.md, DESIGN.md and README.md":                    2,
		"See README.md.":                                           0,
	} {
		if got := citationProblems(text, docs, map[string]bool{"README.md": true}); len(got) != want {
			t.Errorf("%q: %d problems %v, want %d", text, len(got), got, want)
		}
	}
}

// TestShippedFilesCiteNoMissingDocument: the files an operator reads
// besides the Go code (the deploy files, the scripts, docker-compose.yml,
// the Makefile and the test vectors) cite docs/ as the comments do. The
// ClickHouse migrations are left out: an applied migration's text is
// checksummed in every database it was applied to, and never changes.
func TestShippedFilesCiteNoMissingDocument(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	docs, rootDocs := headings(t, root), rootDocuments(t, root)
	var files []string
	for _, dir := range []string{"deploy", "scripts", "schemas/testdata"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && !strings.HasSuffix(path, ".go") {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	files = append(files, filepath.Join(root, "docker-compose.yml"), filepath.Join(root, "Makefile"))
	if len(files) < 20 {
		t.Fatalf("%d files found, want the deploy files and scripts", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for i, line := range strings.Split(string(b), "\n") {
			for _, p := range citationProblems(line, docs, rootDocs) {
				t.Errorf("%s:%d %s", rel, i+1, p)
			}
		}
	}
}
