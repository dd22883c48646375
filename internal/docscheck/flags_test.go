package docscheck

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/meterline/meterline/internal/cli"
)

// docFlag is a long flag in the docs: --name, or --[no-]name as help
// prints a negatable one.
var docFlag = regexp.MustCompile(`(^|[^A-Za-z0-9_-])--(\[no-\])?([a-z][a-z0-9]*(-[a-z0-9]+)*)`)

// otherToolsFlags are the flags the docs give to other programs: Kafka's
// command-line tools (kafka-acls.sh, kafka-configs.sh, kafka-storage.sh,
// kafka-consumer-groups.sh),
// curl, clickhouse-client and docker compose.
var otherToolsFlags = map[string]bool{
	"topic": true, "operation": true, "command-config": true, "bootstrap-server": true, "allow-principal": true,
	"add": true, "resource-pattern-type": true, "entity-type": true, "entity-name": true, "alter": true,
	"add-scram": true, "add-config": true, "fail-with-body": true, "query": true, "detach": true, "build": true,
	"reset-offsets": true, "to-offset": true, "to-earliest": true, "to-latest": true, "execute": true,
}

// meterlineFlags returns the name of every flag of every meterline
// command, hidden ones included, and "no-" before a negatable one.
func meterlineFlags(t *testing.T) map[string]bool {
	t.Helper()
	var c cli.CLI
	k, err := cli.Parser(&c, cli.IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	_ = kong.Visit(k.Model, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok {
			flags[f.Name] = true
			if f.Tag.Negatable != "" {
				flags["no-"+f.Name] = true
			}
		}
		return next(nil)
	})
	return flags
}

// unknownFlags returns the long flags text names that are neither in known
// nor other programs' flags.
func unknownFlags(text string, known map[string]bool) []string {
	var out []string
	for _, m := range docFlag.FindAllStringSubmatch(text, -1) {
		if name := m[3]; !known[name] && !otherToolsFlags[name] {
			out = append(out, "--"+name)
		}
	}
	return out
}

// TestDocFlagsExist requires every long flag README.md and docs/ give to
// be a flag of a meterline command (or of one of the other programs the
// docs call), so that a renamed or misspelt flag cannot stay in the docs.
func TestDocFlagsExist(t *testing.T) {
	_, files, _ := docs(t)
	known := meterlineFlags(t)
	for name, c := range files {
		if name == "CHANGELOG.md" {
			continue
		}
		for i, l := range strings.Split(c, "\n") {
			for _, f := range unknownFlags(l, known) {
				t.Errorf("%s:%d: %s is no flag of any meterline command (nor of the other programs the docs call)", name, i+1, f)
			}
		}
	}
}

// TestUnknownFlags: the extraction finds flags in prose, code spans and
// commands, negatable ones as help prints them, and not options of one
// dash or a decrement.
func TestUnknownFlags(t *testing.T) {
	known := map[string]bool{"brokers": true, "ingest-quota-gate": true, "no-ingest-quota-gate": true}
	got := unknownFlags("run `meterline produce --brokres x --brokers y` with --[no-]ingest-quota-gate, --no-ingest-quota-gate, -run X, i-- and --bootstrap-server;--dedup-window.", known)
	if strings.Join(got, " ") != "--brokres --dedup-window" {
		t.Errorf("unknown flags %v, want --brokres --dedup-window", got)
	}
}
