package docscheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// A block is one fenced code block of a Markdown file.
type block struct {
	file string // relative to the repository root, e.g. "docs/operations.md"
	line int    // 1-based line of the opening fence
	lang string
	text string // the lines between the fences, each ending in "\n"
	ann  *annotation
	// annErr is why the annotation before the block could not be parsed.
	annErr error
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// shell reports whether the block holds commands a reader would run.
func (b block) shell() bool {
	switch b.lang {
	case "sh", "bash", "shell", "console":
		return true
	}
	return false
}

// Annotation kinds.
const (
	kindRun         = "run"          // run in a temporary directory
	kindRunInRepo   = "run-in-repo"  // run in the repository
	kindTestedBy    = "tested-by"    // args: test names
	kindTestCommand = "test-command" // go test / make commands, checked statically
	kindRunBy       = "run-by"       // args: one file that runs every line
	kindSameAs      = "same-as"      // args: one file the block's text equals (any language)
)

// An annotation is the HTML comment `<!-- docs-check: KIND ARGS [; replace "A" "B"]... -->`
// on the last non-blank line before a block.
type annotation struct {
	kind    string
	args    []string
	replace [][2]string
}

var annotationLine = regexp.MustCompile(`^<!--\s*docs-check:(.*)-->\s*$`)

// parseAnnotation parses the text after "docs-check:".
func parseAnnotation(s string) (*annotation, error) {
	toks, err := tokens(s)
	if err != nil {
		return nil, err
	}
	var clauses [][]string
	cur := []string{}
	for _, t := range toks {
		if t == ";" {
			clauses = append(clauses, cur)
			cur = []string{}
			continue
		}
		cur = append(cur, t)
	}
	clauses = append(clauses, cur)
	if len(clauses[0]) == 0 {
		return nil, fmt.Errorf("docs-check annotation without a kind")
	}
	a := &annotation{kind: clauses[0][0], args: clauses[0][1:]}
	switch a.kind {
	case kindRun, kindRunInRepo, kindTestCommand:
		if len(a.args) != 0 {
			return nil, fmt.Errorf("%s takes no arguments, got %q", a.kind, a.args)
		}
	case kindTestedBy:
		if len(a.args) == 0 {
			return nil, fmt.Errorf("tested-by names no test")
		}
	case kindRunBy, kindSameAs:
		if len(a.args) != 1 {
			return nil, fmt.Errorf("%s names one file, got %q", a.kind, a.args)
		}
	default:
		return nil, fmt.Errorf("unknown docs-check kind %q (want %s, %s, %s, %s, %s or %s)",
			a.kind, kindRun, kindRunInRepo, kindTestedBy, kindTestCommand, kindRunBy, kindSameAs)
	}
	for _, c := range clauses[1:] {
		if len(c) != 3 || c[0] != "replace" {
			return nil, fmt.Errorf(`want ; replace "A" "B", got %q`, c)
		}
		if a.kind != kindRun && a.kind != kindRunInRepo {
			return nil, fmt.Errorf("replace applies to blocks that are run, not to %s", a.kind)
		}
		a.replace = append(a.replace, [2]string{c[1], c[2]})
	}
	return a, nil
}

// tokens splits s at blanks, keeping "double" and 'single' quoted strings
// whole (without their quotes; a backslash escapes the next character
// inside double quotes) and returning each unquoted ';' as a token of its
// own.
func tokens(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in := false // a token is being built
	flush := func() {
		if in {
			out = append(out, cur.String())
			cur.Reset()
			in = false
		}
	}
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case unicode.IsSpace(r):
			flush()
		case r == ';':
			flush()
			out = append(out, ";")
		case r == '"' || r == '\'':
			in = true
			j := i + 1
			for ; j < len(rs) && rs[j] != r; j++ {
				if r == '"' && rs[j] == '\\' && j+1 < len(rs) {
					j++
				}
				cur.WriteRune(rs[j])
			}
			if j == len(rs) {
				return nil, fmt.Errorf("unterminated %c in %q", r, s)
			}
			i = j
		default:
			in = true
			cur.WriteRune(r)
		}
	}
	flush()
	return out, nil
}

// parseBlocks returns the fenced code blocks of a Markdown file, with the
// annotation on the last non-blank line before each. A block indented in
// a list item is one too: its fences and lines carry the item's
// indentation, which its text is without.
func parseBlocks(file, content string) ([]block, error) {
	lines := strings.SplitAfter(content, "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		l := strings.TrimRight(lines[i], "\n")
		fenceText := strings.TrimLeft(l, " ")
		if !strings.HasPrefix(fenceText, "```") {
			continue
		}
		indent := l[:len(l)-len(fenceText)]
		b := block{file: file, line: i + 1, lang: strings.TrimSpace(strings.TrimPrefix(fenceText, "```"))}
		for p := i - 1; p >= 0; p-- {
			prev := strings.TrimSpace(lines[p])
			if prev == "" {
				continue
			}
			if m := annotationLine.FindStringSubmatch(prev); m != nil {
				b.ann, b.annErr = parseAnnotation(m[1])
			}
			break
		}
		var text strings.Builder
		j := i + 1
		for ; j < len(lines) && strings.TrimRight(lines[j], "\n") != indent+"```"; j++ {
			text.WriteString(strings.TrimPrefix(lines[j], indent))
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%s:%d: code block never closed", file, i+1)
		}
		b.text = text.String()
		out = append(out, b)
		i = j
	}
	return out, nil
}

// docFiles returns README.md, CHANGELOG.md and docs/*.md, relative to the
// repository root.
func docFiles(root string) ([]string, error) {
	files := []string{"README.md", "CHANGELOG.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	for _, f := range more {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			return nil, err
		}
		files = append(files, rel)
	}
	sort.Strings(files[2:])
	return files, nil
}

// repoRoot is the repository root: this package is internal/docscheck.
func repoRoot() (string, error) {
	return filepath.Abs(filepath.Join("..", ".."))
}

func readDoc(root, rel string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, rel))
	return string(b), err
}

// commandLines joins the block's backslash-continued lines and drops blank
// lines and comment lines.
func commandLines(text string) []string {
	var out []string
	var cur strings.Builder
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if cur.Len() == 0 && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if strings.HasSuffix(t, "\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(t)
		out = append(out, strings.TrimSpace(cur.String()))
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, strings.TrimSpace(cur.String()))
	}
	return out
}

var trailingComment = regexp.MustCompile(`\s+#.*$`)

// backgroundCommands counts the commands the block leaves running in the
// background: lines that end in a single '&' once a trailing comment is
// removed.
func backgroundCommands(text string) int {
	n := 0
	for _, l := range commandLines(text) {
		l = strings.TrimSpace(trailingComment.ReplaceAllString(l, ""))
		if strings.HasSuffix(l, "&") && !strings.HasSuffix(l, "&&") {
			n++
		}
	}
	return n
}

// slug is the anchor GitHub gives a heading: lower case, blanks turned into
// '-', every other character that is not a letter, digit, '-' or '_' dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	headingLine = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	inlineCode  = regexp.MustCompile("`[^`]*`")
	mdLink      = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)
)

// anchors returns the heading anchors of a Markdown file.
func anchors(content string) map[string]bool {
	out := map[string]bool{}
	fenced := false
	for _, l := range strings.Split(content, "\n") {
		if fence.MatchString(l) {
			fenced = !fenced
			continue
		}
		if m := headingLine.FindStringSubmatch(l); m != nil && !fenced {
			out[slug(m[1])] = true
		}
	}
	return out
}

// links returns the targets of the Markdown links and images of a file,
// outside code, with their line numbers.
func links(content string) (targets []string, lines []int) {
	fenced := false
	for i, l := range strings.Split(content, "\n") {
		if fence.MatchString(l) {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(l, ""), -1) {
			targets = append(targets, m[1])
			lines = append(lines, i+1)
		}
	}
	return targets, lines
}
