package docscheck

import (
	"bytes"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/meterline/meterline/internal/cli"
)

// docFlag is a long flag in the docs: --name, or --[no-]name as help
// prints a negatable one.
var docFlag = regexp.MustCompile(`(^|[^A-Za-z0-9_-])--(\[no-\])?([a-z][a-z0-9]*(-[a-z0-9]+)*)`)

// otherToolsFlags are the flags the docs give to other programs: Kafka's
// command-line tools (kafka-acls.sh, kafka-configs.sh, kafka-storage.sh,
// kafka-consumer-groups.sh, kafka-topics.sh, kafka-transactions.sh,
// kafka-log-dirs.sh, kafka-get-offsets.sh, kafka-console-consumer.sh),
// curl, clickhouse-client and docker compose.
var otherToolsFlags = map[string]bool{
	"topic": true, "operation": true, "command-config": true, "bootstrap-server": true, "allow-principal": true,
	"add": true, "resource-pattern-type": true, "entity-type": true, "entity-name": true, "alter": true,
	"add-scram": true, "add-config": true, "fail-with-body": true, "query": true, "detach": true, "build": true,
	"reset-offsets": true, "to-offset": true, "to-earliest": true, "to-latest": true, "execute": true, "delete": true,
	"describe": true, "broker-id": true, "start-offset": true, "max-transaction-timeout": true, "topic-list": true,
	"time": true, "offset": true, "max-messages": true, "property": true, "under-min-isr-partitions": true,
	"unavailable-partitions": true,
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

// flagKind is what a flag's value is, as a config file or a variable
// writes it: a list, a number, a switch or a text.
func flagKind(f *kong.Flag) string {
	switch f.Target.Kind() {
	case reflect.Slice, reflect.Map:
		return "list"
	case reflect.Bool:
		return "switch"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		if f.Target.Type() == reflect.TypeOf(time.Duration(0)) {
			return "duration"
		}
		return "number"
	}
	return "text"
}

// conflictingFlags returns the flag names that commands give values of
// different kinds (a file name here, a list there), with the commands of
// each kind.
func conflictingFlags(t *testing.T) map[string]map[string][]string {
	t.Helper()
	var c cli.CLI
	k, err := cli.Parser(&c, cli.IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]map[string][]string{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			if kinds[f.Name] == nil {
				kinds[f.Name] = map[string][]string{}
			}
			kinds[f.Name][flagKind(f)] = append(kinds[f.Name][flagKind(f)], n.Path())
		}
		for _, ch := range n.Children {
			walk(ch)
		}
	}
	walk(k.Model.Node)
	for name, ks := range kinds {
		if len(ks) < 2 {
			delete(kinds, name)
		}
	}
	return kinds
}

// TestConflictingConfigKeysDocumented: a config file or an environment
// shared by several commands sets a flag of one name in each, so a name
// whose value is of another kind in another command (a meters file here,
// a list of meters there) must be in the list of such names in
// docs/operations.md, "Configuration and environment".
func TestConflictingConfigKeysDocumented(t *testing.T) {
	_, files, _ := docs(t)
	listed := map[string]bool{}
	for _, l := range section(t, files, "docs/operations.md", "Configuration and environment") {
		if m := listedKey.FindStringSubmatch(l); m != nil {
			listed[m[1]] = true
		}
	}
	conflicts := conflictingFlags(t)
	if len(conflicts) == 0 {
		t.Fatal("no flag name with values of two kinds: the walk of the commands found nothing")
	}
	for name, ks := range conflicts {
		if !listed[name] {
			t.Errorf("--%s takes values of different kinds in different commands (%v), and docs/operations.md, Configuration and environment, does not list it (\"- `%s`: ...\")", name, ks, name)
		}
	}
}

// TestConflictingConfigKeysNameEveryCommand: the item of such a name in
// that list names every command that reads it (in a code span: `sink`
// or `sink run` for the sink), so that an operator who shares a config
// file or an environment between commands sees each one the key sets:
// a command left out is one whose flag the file sets unawares.
func TestConflictingConfigKeysNameEveryCommand(t *testing.T) {
	_, files, _ := docs(t)
	items := map[string]string{}
	var cur string
	for _, l := range section(t, files, "docs/operations.md", "Configuration and environment") {
		switch m := listedKey.FindStringSubmatch(l); {
		case m != nil:
			cur = m[1]
		case cur != "" && strings.HasPrefix(l, "  "):
		default:
			cur = ""
		}
		if cur != "" {
			items[cur] += " " + strings.TrimSpace(l)
		}
	}
	for name, ks := range conflictingFlags(t) {
		item, ok := items[name]
		if !ok {
			continue // TestConflictingConfigKeysDocumented reports it
		}
		if missing := unnamedCommands(item, ks); len(missing) > 0 {
			t.Errorf("docs/operations.md, Configuration and environment, item `%s`: does not name %s, which read --%s", name, strings.Join(missing, ", "), name)
		}
	}
}

// unnamedCommands returns the commands of kinds (by kind, as
// conflictingFlags gives them) that item names in no code span.
func unnamedCommands(item string, kinds map[string][]string) []string {
	spans := map[string]bool{}
	for _, m := range codeSpan.FindAllStringSubmatch(item, -1) {
		spans[m[1]] = true
	}
	var out []string
	for _, cmds := range kinds {
		for _, c := range cmds {
			if !spans[c] && !spans[strings.TrimSuffix(c, " run")] {
				out = append(out, c)
			}
		}
	}
	sort.Strings(out)
	return out
}

// listedKey is an item of that list: "- `meters`: ...".
var listedKey = regexp.MustCompile("^- `([a-z0-9-]+)`:")
