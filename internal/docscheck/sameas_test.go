package docscheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A same-as block passes only when it is the file, byte for byte.
func TestSameAs(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "ex.py"), []byte("print(1)\nprint(2)\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := "<!-- docs-check: same-as ex.py -->\n```python\nprint(1)\nprint(2)\n```\n\n<!-- docs-check: same-as ex.py -->\n```python\nprint(1)\n```\n"
	bs, err := parseBlocks("doc.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || bs[0].ann == nil || bs[0].ann.kind != kindSameAs {
		t.Fatalf("blocks %+v", bs)
	}
	if errs := checkStatic(root, nil, bs[0]); len(errs) != 0 {
		t.Errorf("the same text: %v", errs)
	}
	if errs := checkStatic(root, nil, bs[1]); len(errs) != 1 || !strings.Contains(errs[0].Error(), "differs from the file") {
		t.Errorf("another text: %v", errs)
	}
	if _, err := parseAnnotation(" same-as a b "); err == nil {
		t.Error("same-as with two files parsed")
	}
}
