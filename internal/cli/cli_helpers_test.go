package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// tempFiles returns a function that writes a file of name and content
// (mode 0600) to a directory of the test's own and returns its path.
func tempFiles(t *testing.T) func(name, content string) string {
	dir := t.TempDir()
	return func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
}
