package entitlements

import (
	"strings"
	"testing"
)

// TestEmptyDocumentRefused: a document with no content (an empty or
// truncated file, comments alone, a lone `---`, `null`) is refused; read
// as a record with no fields, set-default wrote a default plan with no
// cap and set-rates a card that prices nothing, for every customer. A
// record with no fields on purpose is written `{}`.
func TestEmptyDocumentRefused(t *testing.T) {
	for _, doc := range []string{"", "\n", "  \n", "# the plan\n", "---\n", "--- # x\n...\n", "null\n", "~\n", "\ufeff", "\ufeff# x\n"} {
		if d, err := ParseDocument([]byte(doc)); err == nil || !strings.Contains(err.Error(), "the document is empty") {
			t.Errorf("ParseDocument(%q) = %+v, %v; want it refused as empty", doc, d, err)
		}
		if d, err := ParseRatesDocument([]byte(doc)); err == nil || !strings.Contains(err.Error(), "the document is empty") {
			t.Errorf("ParseRatesDocument(%q) = %+v, %v; want it refused as empty", doc, d, err)
		}
	}
	for _, doc := range []string{"{}", "{}\n", "--- {}\n", "# x\n{}\n"} {
		if _, err := ParseDocument([]byte(doc)); err != nil {
			t.Errorf("ParseDocument(%q): %v", doc, err)
		}
		if _, err := ParseRatesDocument([]byte(doc)); err != nil {
			t.Errorf("ParseRatesDocument(%q): %v", doc, err)
		}
	}
}
