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

// TestParseRateDecimalOnly: a rate is an integer, a fraction or a decimal
// (docs/entitlements.md, The rate card), in digits: math/big also read a
// hexadecimal, binary or octal number (0x10 was 16, 0b11 3, 0x1.8p1
// 3000/1000), which an Int field of the same document refuses.
func TestParseRateDecimalOnly(t *testing.T) {
	for _, in := range []string{"0x10", "0X10", "0b11", "0B11", "0o17", "0O17", "0x1.8p1", "0x1p-2", "-0x10", "+0x10", "0x_10"} {
		if m, p, err := ParseRate(in); err == nil || !strings.Contains(err.Error(), "not a rate such as") {
			t.Errorf("ParseRate(%q) = %d/%d, %v; want it refused as not a rate", in, m, p, err)
		}
	}
	for in, want := range map[string][2]int64{"017": {17, 1}, "+5": {5, 1}, "5.": {5, 1}, ".5": {5, 10}, "1_000.5": {10005, 10}} {
		if m, p, err := ParseRate(in); err != nil || m != want[0] || p != want[1] {
			t.Errorf("ParseRate(%q) = %d/%d, %v; want %d/%d", in, m, p, err, want[0], want[1])
		}
	}
}
