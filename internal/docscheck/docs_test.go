package docscheck

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// maxREADMELines bounds README.md: a newcomer's page, with the depth in docs/.
const maxREADMELines = 350

// workingSessions matches text about the project's own working sessions,
// which the documentation must not contain (it describes the software; the
// changelog dates its history).
var workingSessions = regexp.MustCompile(`(?i)\bsession [0-9]|session-[0-9]|this session|earlier session|last session`)

// docs reads every documentation file and its blocks.
func docs(t *testing.T) (root string, files map[string]string, blocks []block) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	names, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	files = map[string]string{}
	for _, n := range names {
		c, err := readDoc(root, n)
		if err != nil {
			t.Fatal(err)
		}
		files[n] = c
		bs, err := parseBlocks(n, c)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, bs...)
	}
	return root, files, blocks
}

func TestREADMEIsShort(t *testing.T) {
	_, files, _ := docs(t)
	if n := strings.Count(files["README.md"], "\n"); n > maxREADMELines {
		t.Errorf("README.md has %d lines, more than %d: move the depth to docs/", n, maxREADMELines)
	}
}

func TestNoWorkingSessions(t *testing.T) {
	_, files, _ := docs(t)
	for name, c := range files {
		for i, l := range strings.Split(c, "\n") {
			if workingSessions.MatchString(l) {
				t.Errorf("%s:%d speaks of working sessions (describe the software; date history in CHANGELOG.md): %s", name, i+1, l)
			}
		}
	}
}

// TestEveryShellBlockIsChecked requires every code block to name its
// language and every shell block to carry an annotation, and checks what
// can be checked without services: named tests exist, run-by files run the
// lines, test commands name packages and tests that exist, replacements
// apply. TestRealDocsCommands runs the blocks marked run.
func TestEveryShellBlockIsChecked(t *testing.T) {
	root, _, blocks := docs(t)
	tests := testFuncs(t, root)
	for _, b := range blocks {
		switch {
		case b.annErr != nil:
			t.Errorf("%s: %v", b.where(), b.annErr)
		case b.lang == "":
			t.Errorf("%s: code block without a language (```sh, ```text, ...)", b.where())
		case b.ann != nil && b.ann.kind == kindSameAs:
			// Any language: the block is a copy of a file that a test runs.
			for _, err := range checkStatic(root, tests, b) {
				t.Errorf("%s: %v", b.where(), err)
			}
		case !b.shell() && b.ann != nil:
			t.Errorf("%s: docs-check annotation on a %s block; only shell blocks are run (or same-as a file)", b.where(), b.lang)
		case b.shell() && b.ann == nil:
			t.Errorf("%s: shell block with no <!-- docs-check: ... --> annotation: run it, or name the test that covers it (docs/testing.md, \"The docs check\")", b.where())
		case b.shell():
			for _, err := range checkStatic(root, tests, b) {
				t.Errorf("%s: %v", b.where(), err)
			}
		}
	}
}

// checkStatic checks an annotated shell block without running it.
func checkStatic(root string, tests map[string][]string, b block) []error {
	var errs []error
	a := b.ann
	for _, r := range a.replace {
		if !strings.Contains(b.text, r[0]) {
			errs = append(errs, fmt.Errorf("replace %q: not in the block", r[0]))
		}
	}
	switch a.kind {
	case kindTestedBy:
		for _, name := range a.args {
			if len(tests[name]) == 0 {
				errs = append(errs, fmt.Errorf("tested-by %s: no func %s in any _test.go file", name, name))
			}
		}
	case kindRunBy:
		content, err := os.ReadFile(filepath.Join(root, a.args[0]))
		if err != nil {
			return append(errs, fmt.Errorf("run-by: %w", err))
		}
		have := map[string]bool{}
		for _, l := range strings.Split(string(content), "\n") {
			have[strings.TrimSpace(l)] = true
		}
		for _, l := range commandLines(b.text) {
			if !have[l] {
				errs = append(errs, fmt.Errorf("run-by %s: it has no line %q", a.args[0], l))
			}
		}
	case kindSameAs:
		content, err := os.ReadFile(filepath.Join(root, a.args[0]))
		if err != nil {
			return append(errs, fmt.Errorf("same-as: %w", err))
		}
		if string(content) != b.text {
			errs = append(errs, fmt.Errorf("same-as %s: the block differs from the file (copy the file into the block)", a.args[0]))
		}
	case kindTestCommand:
		for _, l := range commandLines(b.text) {
			if err := checkTestCommand(root, tests, l); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

var testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Example|Benchmark)\w*)\(`)

// testFuncs maps each test, fuzz target, example and benchmark of the
// repository to the directories that define one of that name.
func testFuncs(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(src), -1) {
			out[m[1]] = append(out[m[1]], filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var envAssignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// checkTestCommand checks a `go test` or `make` command line: packages and
// make targets exist, and the -run and -fuzz patterns match tests in them.
func checkTestCommand(root string, tests map[string][]string, line string) error {
	toks, err := tokens(line)
	if err != nil {
		return err
	}
	for len(toks) > 0 && envAssignment.MatchString(toks[0]) {
		toks = toks[1:]
	}
	switch {
	case len(toks) >= 2 && toks[0] == "go" && toks[1] == "test":
		return checkGoTest(root, tests, toks[2:])
	case len(toks) >= 2 && toks[0] == "make":
		for _, target := range toks[1:] {
			if envAssignment.MatchString(target) || strings.HasPrefix(target, "-") {
				continue
			}
			cmd := exec.Command("make", "-n", target)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("make -n %s: %v\n%s", target, err, out)
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				l := strings.TrimSpace(sc.Text())
				if strings.HasPrefix(l, "go test ") {
					if err := checkTestCommand(root, tests, l); err != nil {
						return fmt.Errorf("make %s: %w", target, err)
					}
				}
			}
		}
		return nil
	}
	return fmt.Errorf("test-command %q: not a `go test` or `make` command", line)
}

// goTestValueFlags are the go test flags that take a value.
var goTestValueFlags = map[string]bool{
	"run": true, "skip": true, "fuzz": true, "bench": true, "timeout": true, "count": true, "p": true,
	"fuzztime": true, "parallel": true, "cpu": true, "tags": true, "o": true, "coverprofile": true,
	"cpuprofile": true, "memprofile": true, "benchtime": true, "list": true, "exec": true,
}

func checkGoTest(root string, tests map[string][]string, args []string) error {
	flags := map[string]string{}
	var pkgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			pkgs = append(pkgs, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if goTestValueFlags[name] && !hasValue {
			if i+1 == len(args) {
				return fmt.Errorf("go test: -%s needs a value", name)
			}
			i++
			value = args[i]
		}
		flags[name] = value
	}
	if len(pkgs) == 0 {
		pkgs = []string{"."}
	}
	cmd := exec.Command("go", append([]string{"list", "-f", "{{.Dir}}"}, pkgs...)...)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list %s: %v\n%s", strings.Join(pkgs, " "), err, stderr.String())
	}
	dirs := map[string]bool{}
	for _, d := range strings.Fields(string(out)) {
		dirs[d] = true
	}
	matching := func(pattern, prefix string) ([]string, error) {
		re, err := regexp.Compile(strings.SplitN(pattern, "/", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("go test: pattern %q: %v", pattern, err)
		}
		var names []string
		for name, ds := range tests {
			if !strings.HasPrefix(name, prefix) || !re.MatchString(name) {
				continue
			}
			for _, d := range ds {
				if dirs[d] {
					names = append(names, name)
				}
			}
		}
		return names, nil
	}
	if p, ok := flags["fuzz"]; ok {
		names, err := matching(p, "Fuzz")
		if err != nil {
			return err
		}
		if len(dirs) != 1 || len(names) != 1 {
			return fmt.Errorf("go test -fuzz %s %s: matches %q; it must match one fuzz target of one package", p, strings.Join(pkgs, " "), names)
		}
	}
	if p, ok := flags["run"]; ok {
		names, err := matching(p, "")
		if err != nil {
			return err
		}
		if len(names) == 0 && flags["fuzz"] == "" {
			return fmt.Errorf("go test -run %s %s: no test of those packages matches", p, strings.Join(pkgs, " "))
		}
	}
	return nil
}

// TestLinks requires every relative link of the documentation to point at
// a file that exists and, for a Markdown file, at a heading it has.
func TestLinks(t *testing.T) {
	root, files, _ := docs(t)
	for name, c := range files {
		targets, lines := links(c)
		for i, target := range targets {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := name
			if path != "" {
				file = filepath.Join(filepath.Dir(name), path)
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s:%d: link to %s: %v", name, lines[i], target, errors.Unwrap(err))
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			content, err := readDoc(root, file)
			if err != nil {
				t.Errorf("%s:%d: link to %s: %v", name, lines[i], target, err)
				continue
			}
			if !anchors(content)[anchor] {
				t.Errorf("%s:%d: link to %s: %s has no heading #%s", name, lines[i], target, file, anchor)
			}
		}
	}
}

// TestAnalystQueriesDocumented keeps docs/analysts.md equal to
// sink.AnalystQueries, which TestAnalystQueries runs on real data, and the
// balance queries of docs/entitlements.md equal to sink.BalanceQueries,
// which TestBalanceQueries runs: the same queries, titles and order, and
// no other SQL anywhere in the docs.
func TestAnalystQueriesDocumented(t *testing.T) {
	_, files, blocks := docs(t)
	norm := func(s string) string { return strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), ";")) }
	queries := map[string][]sink.AnalystQuery{"docs/analysts.md": sink.AnalystQueries, "docs/entitlements.md": sink.BalanceQueries}
	sql := map[string][]block{}
	for _, b := range blocks {
		if b.lang != "sql" {
			continue
		}
		if queries[b.file] == nil {
			t.Errorf("%s: SQL outside docs/analysts.md and docs/entitlements.md is not run by any test", b.where())
			continue
		}
		sql[b.file] = append(sql[b.file], b)
	}
	for file, qs := range queries {
		if len(sql[file]) != len(qs) {
			t.Errorf("%s has %d SQL blocks, want %d (the queries its test runs)", file, len(sql[file]), len(qs))
			continue
		}
		lines := strings.Split(files[file], "\n")
		for i, q := range qs {
			b := sql[file][i]
			if norm(b.text) != norm(q.SQL) {
				t.Errorf("%s: query %d differs from %s (%s):\n%s\nwant:\n%s", b.where(), i+1, file, q.Name, norm(b.text), norm(q.SQL))
			}
			title := ""
			for p := b.line - 2; p >= 0; p-- {
				if l := strings.TrimSpace(lines[p]); l != "" {
					title = l
					break
				}
			}
			if !strings.HasPrefix(title, "**"+q.Title+"**") {
				t.Errorf("%s: the line before query %d is %q; want it to start with **%s**", b.where(), i+1, title, q.Title)
			}
		}
	}
}
