package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RepoRoot returns the repository's root: the nearest directory above the
// working directory (a test's package directory) that holds go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// DocBlocks returns the fenced code blocks in lang (the word after the
// opening fence) of a Markdown file of the repository, file relative to
// its root, that contain needle, each as its text.
func DocBlocks(t testing.TB, file, lang, needle string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(t), file))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```"+lang {
			continue
		}
		var text strings.Builder
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			text.WriteString(lines[i] + "\n")
		}
		if strings.Contains(text.String(), needle) {
			out = append(out, text.String())
		}
	}
	return out
}

// ClientPython returns the python of the project's client virtualenv
// (scripts/client-venv.sh: OpenMeter's SDK, CloudEvents, confluent-kafka,
// fastavro), making it on first use.
func ClientPython(t testing.TB) string {
	t.Helper()
	return clientScript(t, "client-venv.sh")
}

// ClientNode returns the directory of OpenMeter's Node SDK
// (scripts/client-node.sh: @openmeter/sdk), installing it on first use.
// An ES module that `node --input-type=module` runs there, from its
// standard input, imports '@openmeter/sdk' from that directory.
func ClientNode(t testing.TB) string {
	t.Helper()
	return clientScript(t, "client-node.sh")
}

// clientScript runs one of the scripts that install the third-party
// clients and returns the path it prints.
func clientScript(t testing.TB, name string) string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(RepoRoot(t), "scripts", name))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/%s: %v\n%s", name, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}
