package lint

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestExportedFunctionDocs: the doc comment of an exported function
// outside tests begins with its name (go doc shows it as the function's
// documentation): a function inserted between another's comment and
// that function takes the other's comment as its own.
func TestExportedFunctionDocs(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range functions(t, root) {
		if !f.fn.Name.IsExported() || f.fn.Doc == nil {
			continue
		}
		if doc, name := f.fn.Doc.Text(), f.fn.Name.Name; !strings.HasPrefix(doc, name+" ") && !strings.HasPrefix(doc, name+":") {
			t.Errorf("%s (%s): its doc comment begins %q, not with its name", f.key, f.where, strings.SplitN(doc, "\n", 2)[0])
		}
	}
}
