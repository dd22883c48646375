package docscheck

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/cli"
	"github.com/meterline/meterline/internal/testenv"
)

// segments splits a shell command line at its unquoted control operators
// and substitutions (|, &, ;, (, ), `, $( ) and drops a trailing comment,
// keeping quoted text whole.
func segments(line string) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == '\'' || r == '"':
			j := i + 1
			for ; j < len(rs) && rs[j] != r; j++ {
				if r == '"' && rs[j] == '\\' && j+1 < len(rs) {
					j++
				}
			}
			if j == len(rs) {
				j--
			}
			cur.WriteString(string(rs[i : j+1]))
			i = j
		case r == '#' && (i == 0 || rs[i-1] == ' ' || rs[i-1] == '\t'):
			flush()
			return out
		case strings.ContainsRune("|&;()`", r):
			flush()
		case r == '$' && i+1 < len(rs) && rs[i+1] == '(':
			flush()
			i++
		default:
			cur.WriteRune(r)
		}
	}
	flush()
	return out
}

// meterlineArgs returns the arguments of a meterline invocation in seg
// (meterline, bin/meterline or go run ./cmd/meterline, after any VAR=value
// assignments), and whether seg is one.
func meterlineArgs(seg string) ([]string, bool, error) {
	if !invocation.MatchString(seg) {
		return nil, false, nil
	}
	ts, err := tokens(seg)
	if err != nil {
		return nil, true, err
	}
	for len(ts) > 0 && strings.Contains(ts[0], "=") && !strings.HasPrefix(ts[0], "-") {
		ts = ts[1:]
	}
	if ts[0] == "go" {
		ts = ts[2:]
	}
	var args []string
	for _, a := range ts[1:] {
		if !redirection.MatchString(a) {
			args = append(args, a)
		}
	}
	return args, true, nil
}

var (
	// invocation matches a command segment that runs meterline.
	invocation = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*=\S*\s+)*((\S*/)?meterline|go run \./cmd/meterline)(\s|$)`)
	// redirection matches a shell redirection token (2>/dev/null, >out).
	redirection = regexp.MustCompile(`^[0-9]*[<>]`)
	// pathArg matches an argument that names a file (a.yaml, dir/b.pem).
	pathArg = regexp.MustCompile(`^[A-Za-z0-9_./-]+\.[a-z]+$`)
)

// touchFiles creates, in the current directory, an empty file for every
// argument that names one, so that flags that require an existing file
// parse.
func touchFiles(t *testing.T, args []string) {
	t.Helper()
	for _, a := range args {
		if strings.HasPrefix(a, "-") || !pathArg.MatchString(a) || strings.HasPrefix(a, "/") || strings.Contains(a, "..") {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(a), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(a, nil, 0o600); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
}

// parseArgs parses args with meterline's own parser (after
// testenv.ClearMeterlineEnv); it runs nothing.
func parseArgs(t *testing.T, args []string) error {
	t.Helper()
	var root cli.CLI
	var out bytes.Buffer
	exited := false
	parser, err := cli.Parser(&root, cli.IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out}, func(int) { exited = true })
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		return err
	}
	if exited {
		return errExited(out.String())
	}
	for _, f := range kctx.Flags() {
		if !cli.TakesFlag(kctx.Selected(), f) && slices.ContainsFunc(args, func(a string) bool { return a == "--"+f.Name || strings.HasPrefix(a, "--"+f.Name+"=") }) {
			return fmt.Errorf("--%s is no flag of meterline %s: it does not read it", f.Name, kctx.Command())
		}
	}
	return nil
}

type errExited string

func (e errExited) Error() string { return "the parser exited: " + string(e) }

// TestDocCommandsParse parses every meterline command line of every shell
// block with meterline's own flag parser, run or not: a flag of another
// command, a missing argument or a misspelt subcommand fails here without
// any service.
func TestDocCommandsParse(t *testing.T) {
	_, _, blocks := docs(t)
	testenv.ClearMeterlineEnv(t)
	t.Chdir(t.TempDir())
	n := 0
	for _, b := range blocks {
		if !b.shell() || b.file == "CHANGELOG.md" {
			continue
		}
		for _, line := range commandLines(b.text) {
			for _, seg := range segments(line) {
				args, ok, err := meterlineArgs(seg)
				if err != nil {
					t.Errorf("%s: %q: %v", b.where(), seg, err)
					continue
				}
				if !ok {
					continue
				}
				n++
				touchFiles(t, args)
				if err := parseArgs(t, args); err != nil {
					t.Errorf("%s: meterline %s: %v", b.where(), strings.Join(args, " "), err)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no meterline command line in the docs' shell blocks")
	}
	t.Logf("%d command lines parsed", n)
}

// TestCommandParsing: the invocations of a line are found between its
// operators and substitutions, with assignments and redirections left
// out, and a flag of another command fails to parse although it is a
// meterline flag, as does a global flag of a command that does not read
// it (cli.TakesFlag).
func TestCommandParsing(t *testing.T) {
	testenv.ClearMeterlineEnv(t)
	line := `TOKEN=$(bin/meterline keys create --tenant acme --allow-customers 'acme-*') && X=1 meterline entitlements balance acme 2>/dev/null | grep -q 'a|b' # meterline nope`
	var got [][]string
	for _, seg := range segments(line) {
		args, ok, err := meterlineArgs(seg)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, args)
		}
	}
	want := "keys create --tenant acme --allow-customers acme-*|entitlements balance acme"
	var joined []string
	for _, a := range got {
		joined = append(joined, strings.Join(a, " "))
	}
	if strings.Join(joined, "|") != want {
		t.Errorf("invocations %q, want %q", joined, want)
	}
	for _, args := range got {
		if err := parseArgs(t, args); err != nil {
			t.Errorf("meterline %s: %v", strings.Join(args, " "), err)
		}
	}
	if err := parseArgs(t, []string{"sink", "--window", "840h"}); err == nil {
		t.Error("meterline sink --window 840h parsed: --window is dedup's and the aggregator's")
	}
	if err := parseArgs(t, []string{"demo", "--brokers", "b:9092"}); err == nil {
		t.Error("meterline demo --brokers b:9092 parsed: the demo reads no Kafka flag")
	}
	if _, ok, _ := meterlineArgs("go run ./cmd/meterline demo --duration 1m"); !ok {
		t.Error("go run ./cmd/meterline is no invocation")
	}
}
