package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// history matches text about how the software changed, which belongs in
// CHANGELOG.md only: the other documents describe the software as it is.
// A phrase may be broken across lines.
var history = regexp.MustCompile(`(?i)\bas\s+before\b|\b(as|like)\s+(earlier|previous|older)\s+(versions|builds)\b|\bthis\s+page\s+(gave|said)\b|\bno\s+deployment\s+exists\b|\bused\s+to\s+be\b|\(before:`)

func TestNoHistoryOutsideChangelog(t *testing.T) {
	_, files, _ := docs(t)
	for name, c := range files {
		if name == "CHANGELOG.md" {
			continue
		}
		for _, m := range history.FindAllStringIndex(c, -1) {
			line := strings.Count(c[:m[0]], "\n") + 1
			t.Errorf("%s:%d speaks of the software's history (describe it as it is; date changes in CHANGELOG.md): %q", name, line, c[m[0]:m[1]])
		}
	}
}

// foreignSection matches a reference to a numbered section of a document
// that is not in the repository (a section sign, or the word DESIGN): a
// reader cannot follow it. The docs link to their own headings instead, as
// the code's comments and messages cite them (internal/lint).
var foreignSection = regexp.MustCompile(`§|\bDESIGN\b`)

func TestNoForeignSectionReferences(t *testing.T) {
	_, files, _ := docs(t)
	for name, c := range files {
		if name == "CHANGELOG.md" {
			continue
		}
		for i, l := range strings.Split(c, "\n") {
			if m := foreignSection.FindString(l); m != "" {
				t.Errorf("%s:%d cites %q, a section of no document in the repository: link to a heading of docs/ instead: %s", name, i+1, m, l)
			}
		}
	}
}

var (
	// meterlineName is a metric, table or database name in the docs.
	meterlineName = regexp.MustCompile(`\bmeterline_[a-z0-9_]*[a-z0-9]\b`)
	// quotedMeterlineName is one in a Go string of the code.
	quotedMeterlineName = regexp.MustCompile(`"(meterline_[a-z0-9_]+)"`)
)

// TestMeterlineNamesExist requires every meterline_ name the docs give (a
// metric, a table, a database) to be a string of the code outside tests, so
// that a renamed metric cannot stay in the docs under its old name. A
// histogram's _bucket, _sum and _count series count as its name.
func TestMeterlineNamesExist(t *testing.T) {
	root, files, _ := docs(t)
	code := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range quotedMeterlineName.FindAllStringSubmatch(string(b), -1) {
			code[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(code) == 0 {
		t.Fatal("no meterline_ string in the code: the walk found no Go file")
	}
	for name, c := range files {
		if name == "CHANGELOG.md" {
			continue
		}
		for i, l := range strings.Split(c, "\n") {
			for _, n := range meterlineName.FindAllString(l, -1) {
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if !code[base] && code[strings.TrimSuffix(base, suffix)] {
						base = strings.TrimSuffix(base, suffix)
					}
				}
				if !code[base] {
					t.Errorf("%s:%d: %s is not a string of the code outside tests (renamed or misspelled?)", name, i+1, n)
				}
			}
		}
	}
}

// section returns the lines of file's section "## heading", up to the
// next section.
func section(t *testing.T, files map[string]string, file, heading string) []string {
	t.Helper()
	_, text, ok := strings.Cut(files[file], "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", file, "## "+heading)
	}
	text, _, _ = strings.Cut(text, "\n## ")
	return strings.Split(text, "\n")
}

// reasonRow is a row of the reason-code table of docs/design.md.
var reasonRow = regexp.MustCompile("^\\| `([a-z_]+)` \\|")

// TestReasonCodesDocumented requires the table of docs/design.md's "Bad
// input" section to list every rejection reason code, schemas.Reasons, and
// no other.
func TestReasonCodesDocumented(t *testing.T) {
	_, files, _ := docs(t)
	var listed []string
	for _, l := range section(t, files, "docs/design.md", "Bad input") {
		if m := reasonRow.FindStringSubmatch(l); m != nil {
			listed = append(listed, m[1])
		}
	}
	for _, r := range schemas.Reasons {
		if !slices.Contains(listed, r) {
			t.Errorf("docs/design.md, Bad input: the table of reason codes lacks %s", r)
		}
	}
	for _, r := range listed {
		if !slices.Contains(schemas.Reasons, r) {
			t.Errorf("docs/design.md, Bad input: the table of reason codes lists %s, which is not in schemas.Reasons", r)
		}
	}
}

// codeSpan is a Markdown code span.
var codeSpan = regexp.MustCompile("`([^`]+)`")

// TestFastLoopNamesEveryPackage requires the table of docs/testing.md's
// "The fast loop" to name every package that has tests, so that what a
// newcomer's `go test -short ./...` runs is all on the page.
func TestFastLoopNamesEveryPackage(t *testing.T) {
	root, files, _ := docs(t)
	named := map[string]bool{}
	for _, l := range section(t, files, "docs/testing.md", "The fast loop") {
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(l, "|"), "|")
		for _, m := range codeSpan.FindAllStringSubmatch(first, -1) {
			named[m[1]] = true
		}
	}
	tested := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			tested[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(tested) == 0 {
		t.Fatal("no package with tests: the walk found no _test.go file")
	}
	for p := range tested {
		if !named[p] {
			t.Errorf("docs/testing.md, The fast loop: the table does not name %s, which has tests", p)
		}
	}
}
