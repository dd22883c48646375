package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meterline/meterline/internal/secret"
)

// TestScriptsReadSecretFilesAsMeterline: lib.sh's read_secret (with which
// clickhouse.sh reads CLICKHOUSE_PASSWORD_FILE) gives the password
// secret.FromFile gives for the same file, or fails where it fails, for
// every way a file may end: so a server the script starts requires the
// password Meterline sends. A NUL byte, which a shell variable cannot
// hold, is refused by the script alone.
func TestScriptsReadSecretFilesAsMeterline(t *testing.T) {
	dir := t.TempDir()
	for i, content := range []string{"pw", "pw\n", "pw\r\n", "pw\r", "pw\n\n", "pw\r\n\r\n", "pw\r\r\n", "pw\n\r",
		"p w\t \n", "\n", "\r\n", "\r", "", "x", "two\nlines\n", "trailing-space \n", "a&b<c>\"'$(x)`y`\\\n"} {
		f := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		want, werr := secret.FromFile(f)
		out, err := exec.Command("bash", "-c", `. local/lib.sh && read_secret "$1" && printf '%s' "$SECRET" || { printf '%s' "$SECRET_ERROR" >&2; exit 1; }`, "_", f).Output()
		switch {
		case (err != nil) != (werr != nil):
			t.Errorf("%q: read_secret: %v (%s), secret.FromFile: %v", content, err, stderr(err), werr)
		case err == nil && string(out) != want.Reveal():
			t.Errorf("%q: read_secret gives %q, secret.FromFile %q", content, out, want.Reveal())
		}
	}
	f := filepath.Join(dir, "nul")
	if err := os.WriteFile(f, []byte("a\x00b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("bash", "-c", `. local/lib.sh && read_secret "$1" || { printf '%s' "$SECRET_ERROR"; exit 1; }`, "_", f).Output(); err == nil || string(out) != "it holds a NUL byte" {
		t.Errorf("a file with a NUL byte: %v, %q", err, out)
	}
}

func stderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
