package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEntitlementsDocumentTooLarge: a document larger than the commands
// read is refused, from standard input as from a file, never cut to its
// first 16 MiB and read as a shorter document (here: without its cap).
func TestEntitlementsDocumentTooLarge(t *testing.T) {
	doc := "customer: acme\n#" + strings.Repeat("x", maxDocumentBytes) + "\ncaps: {api_calls: {limit: 10}}\n"
	f := filepath.Join(t.TempDir(), "acme.yaml")
	if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ stdin, file string }{{doc, "-"}, {"", f}} {
		code, out, errs := run(t, c.stdin, "entitlements", "set", "-f", c.file, "--validate")
		if code == 0 || !strings.Contains(errs, "larger than") {
			t.Errorf("-f %s: exit %d, stdout %q, stderr %.300q; want refused as too large", c.file, code, out, errs)
		}
	}
}
