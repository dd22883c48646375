package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigUnknownKey: a key of the --config file that is no flag of any
// command (a misspelt "brokres") is refused, naming it, rather than
// ignored, which would leave the flag at its default (another broker).
// A key of another command's flag is accepted, so that one file can
// serve every command.
func TestConfigUnknownKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := write("bad.yaml", "brokres: [kafka-1:9092]\nlog_level: warn\ntopic_prefx: prod.\n")
	code, _, errOut := run(t, "", "version", "--config", bad)
	if code != 2 || !strings.Contains(errOut, "brokres") || !strings.Contains(errOut, "topic_prefx") {
		t.Errorf("misspelt keys: exit %d, want 2 naming brokres and topic_prefx:\n%s", code, errOut)
	}
	good := write("good.yaml", "brokers: [kafka-1:9092]\naggregate_period: day\nsink_database: m\nwindow: 840h\ningest_addr: 127.0.0.1:1\n")
	if code, _, errOut := run(t, "", "version", "--config", good); code != 0 {
		t.Errorf("keys of other commands' flags: exit %d\n%s", code, errOut)
	}
}

// TestConfigKeysKongIgnores: config and help name flags, but kong reads
// neither from the file (the file is loaded before resolvers run, and help
// acts only on the command line): such a key would pass yet do nothing, so
// it is refused like a misspelt one.
func TestConfigKeysKongIgnores(t *testing.T) {
	for _, body := range []string{"config: other.yaml\n", "help: true\n"} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		key := strings.SplitN(body, ":", 2)[0]
		code, _, errOut := run(t, "", "version", "--config", p)
		if code != 2 || !strings.Contains(errOut, key) {
			t.Errorf("key %s: exit %d, want 2 naming it:\n%s", key, code, errOut)
		}
	}
}
