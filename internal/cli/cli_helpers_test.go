package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
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

// entCommands creates the topics of a test (testenv.Topics with name) on
// brokers and returns their names with functions that run `meterline
// entitlements` with args on them, stdin on its standard input: ent
// returns the exit status and output, must ends the test unless the
// command exits 0.
func entCommands(t *testing.T, brokers []string, name string) (names topics.Names,
	ent func(stdin string, args ...string) (int, string, string), must func(stdin string, args ...string)) {
	names = testenv.Topics(t, brokers, name, testenv.TopicsOpts{})
	ent = func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return run(t, stdin, append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix)...)
	}
	must = func(stdin string, args ...string) {
		t.Helper()
		if code, out, errOut := ent(stdin, args...); code != 0 {
			t.Fatalf("%v: %d\n%s\n%s", args, code, out, errOut)
		}
	}
	return names, ent, must
}
