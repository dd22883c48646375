package docscheck

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/meterline/meterline/internal/cli"
)

// proseSpan is a code span of a paragraph that runs meterline: `meterline
// produce --brokers x`, which may break across lines.
var proseSpan = regexp.MustCompile("`((?:bin/)?meterline\\s[^`]*)`")

// fence is a line that opens or closes a fenced code block.
var fence = regexp.MustCompile("^\\s*(```|~~~)")

// proseText returns c without its fenced code blocks, each of their lines
// left empty so that line numbers stay.
func proseText(c string) string {
	lines := strings.Split(c, "\n")
	in := false
	for i, l := range lines {
		if fence.MatchString(l) {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// commandWord is a word that can name a subcommand.
var commandWord = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// commandProblems returns what is wrong with a meterline invocation a code
// span of prose gives: a word that is no subcommand of the words before
// it, or a long flag that is not one of the command it names (its own or
// an enclosing command's). Words after the first argument or flag are not
// read as subcommands, and placeholders (<command>, CUSTOMER) end the
// command's name. A span whose first word is no command and that gives no
// flag is no invocation (`meterline producer ingest`, a list of names).
func commandProblems(root *kong.Node, span string) []string {
	fields := strings.Fields(span)
	if len(fields) > 1 && !strings.Contains(span, "--") && child(root, fields[1]) == nil {
		return nil
	}
	node := root
	var problems []string
	i := 1
	for ; i < len(fields) && len(node.Children) > 0; i++ {
		w := fields[i]
		if strings.HasPrefix(w, "-") || !commandWord.MatchString(w) {
			break
		}
		next := child(node, w)
		if next == nil {
			if node.DefaultCmd != nil || len(node.Positional) > 0 {
				break
			}
			problems = append(problems, "\""+w+"\" is no subcommand of "+strings.TrimSpace("meterline "+node.Path()))
			return problems
		}
		node = next
	}
	if node.DefaultCmd != nil {
		node = node.DefaultCmd
	}
	flags := map[string]bool{}
	for n := node; n != nil; n = n.Parent {
		for _, f := range n.Flags {
			if !cli.TakesFlag(node, f) {
				continue // a global flag the command does not read
			}
			flags[f.Name] = true
			if f.Tag.Negatable != "" {
				flags["no-"+f.Name] = true
			}
		}
	}
	for _, f := range unknownFlags(strings.Join(fields[i:], " "), flags) {
		problems = append(problems, f+" is no flag of "+strings.TrimSpace("meterline "+node.Path()))
	}
	return problems
}

// child returns the subcommand of n named w, or nil.
func child(n *kong.Node, w string) *kong.Node {
	for _, ch := range n.Children {
		if ch.Name == w || slices.Contains(ch.Aliases, w) {
			return ch
		}
	}
	return nil
}

// commandTree returns the root of meterline's commands.
func commandTree(t *testing.T) *kong.Node {
	t.Helper()
	var c cli.CLI
	k, err := cli.Parser(&c, cli.IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	return k.Model.Node
}

// TestProseCommandsName requires every meterline command a code span of
// README.md or docs/ gives in its prose (`meterline sink --database x`)
// to name subcommands that exist and only flags of that command, as
// TestDocCommandsParse requires of the shell blocks: a flag of another
// command passes TestDocFlagsExist, since it is some command's flag.
func TestProseCommandsName(t *testing.T) {
	_, files, _ := docs(t)
	root := commandTree(t)
	n := 0
	for name, c := range files {
		if name == "CHANGELOG.md" {
			continue
		}
		prose := proseText(c)
		for _, loc := range proseSpan.FindAllStringSubmatchIndex(prose, -1) {
			n++
			line := strings.Count(prose[:loc[0]], "\n") + 1
			for _, p := range commandProblems(root, prose[loc[2]:loc[3]]) {
				t.Errorf("%s:%d: `%s`: %s", name, line, strings.Join(strings.Fields(prose[loc[2]:loc[3]]), " "), p)
			}
		}
	}
	if n == 0 {
		t.Fatal("no meterline command in the docs' prose")
	}
	t.Logf("%d commands in prose checked", n)
}

// TestCommandProblems: a flag of another command, a global flag of a
// command that does not read it (cli.TakesFlag) and a misspelt
// subcommand are found; flags of enclosing commands, negated flags,
// placeholders and a command that defaults to a subcommand are not
// problems.
func TestCommandProblems(t *testing.T) {
	root := commandTree(t)
	for span, want := range map[string]string{
		"meterline sink --window 840h":                       "--window is no flag of meterline sink run",
		"meterline entitlements show acme":                   `"show" is no subcommand of meterline entitlements`,
		"meterline dedup --standby-replicas 1":               "",
		"meterline sink --database x --brokers y":            "",
		"meterline demo --brokers y":                         "--brokers is no flag of meterline demo",
		"meterline lag --clickhouse y":                       "--clickhouse is no flag of meterline lag",
		"meterline run --no-sink --aggregate-entitlements":   "",
		"meterline entitlements delete CUSTOMER --force":     "",
		"meterline <command> --help":                         "",
		"bin/meterline keys create --tenant acme":            "",
		"meterline verify --database meterline_demo --since": "",
		"meterline producer ingest dedup":                    "",
		"meterline entitlment --force":                       `"entitlment" is no subcommand of meterline`,
	} {
		got := strings.Join(commandProblems(root, span), "; ")
		if got != want {
			t.Errorf("%q: problems %q, want %q", span, got, want)
		}
	}
}
