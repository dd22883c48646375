package docscheck

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stageCommands are the commands whose flags the table of defaults of
// docs/operations.md ("Running the stages") gives: the stages, each run
// on its own. A flag's default may differ between them; the table gives
// the others in parentheses ("100ms (sink: 1s)").
var stageCommands = [][]string{{"dedup"}, {"aggregate"}, {"sink", "run"}}

// tableFlag is a flag of a row of that table: "| `--window`, `--skew` |".
var tableFlag = regexp.MustCompile("`--([a-z0-9-]+)`")

// defaultValue is a default as the table or kong writes it, in one form:
// a duration as time.Duration prints it (60s and 1m alike), a number
// without its thousands separators, a switch that is off and an empty
// value as "".
func defaultValue(s string) string {
	s = strings.Trim(strings.TrimSpace(s), "`\"")
	switch s {
	case "none", "empty", "off", "false":
		return ""
	}
	if d, err := time.ParseDuration(s); err == nil && strings.ContainsAny(s, "hms") {
		return d.String()
	}
	if n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64); err == nil {
		return strconv.FormatInt(n, 10)
	}
	return s
}

// mainDefaults are the values a defaults cell gives outside parentheses,
// before any ';': one per flag of the row ("10s, 30s (sink: 60s)").
func mainDefaults(cell string) []string {
	cell, _, _ = strings.Cut(cell, ";")
	cell = regexp.MustCompile(`\([^()]*\)`).ReplaceAllString(cell, "")
	var out []string
	for _, v := range strings.Split(cell, ", ") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, defaultValue(v))
		}
	}
	return out
}

// cellValues are every value a defaults cell names, those in parentheses
// included ("aggregator and sink: 50,000").
func cellValues(cell string) []string {
	var out []string
	for _, v := range regexp.MustCompile(`[\s;()]+|[,:]\s`).Split(cell, -1) {
		if v != "" {
			out = append(out, defaultValue(v))
		}
	}
	return out
}

// stageDefaults returns, for each flag of the stage commands, the
// defaults it has across them.
func stageDefaults(t *testing.T) map[string][]string {
	t.Helper()
	root := commandTree(t)
	out := map[string][]string{}
	for _, path := range stageCommands {
		n := root
		for _, w := range path {
			if n = child(n, w); n == nil {
				t.Fatalf("no command %q", strings.Join(path, " "))
			}
		}
		for _, group := range n.AllFlags(false) {
			for _, f := range group {
				if v := defaultValue(f.Default); !slices.Contains(out[f.Name], v) {
					out[f.Name] = append(out[f.Name], v)
				}
			}
		}
	}
	return out
}

// defaultsProblems says what a row of the table gets wrong: a flag the
// stages do not have, a value given for it that is not its default in
// any stage, or a default of a stage that the row does not give.
func defaultsProblems(defaults map[string][]string, flagsCell, defaultCell string) []string {
	var flags []string
	for _, m := range tableFlag.FindAllStringSubmatch(flagsCell, -1) {
		flags = append(flags, m[1])
	}
	var out []string
	main := mainDefaults(defaultCell)
	if len(flags) > 1 && len(main) != len(flags) {
		return []string{"gives " + strconv.Itoa(len(main)) + " defaults for " + strconv.Itoa(len(flags)) + " flags"}
	}
	all := cellValues(defaultCell)
	for i, f := range flags {
		has, ok := defaults[f]
		if !ok {
			out = append(out, "--"+f+" is no flag of dedup, aggregate or sink")
			continue
		}
		given := main
		if len(flags) > 1 {
			given = main[i : i+1]
		}
		for _, v := range given {
			if !slices.Contains(has, v) {
				out = append(out, "--"+f+": "+strconv.Quote(v)+" is not its default (the stages': "+strings.Join(quoteAll(has), ", ")+")")
			}
		}
		for _, v := range has {
			if !slices.Contains(all, v) {
				out = append(out, "--"+f+": its default "+strconv.Quote(v)+" in a stage is not in the row")
			}
		}
	}
	return out
}

func quoteAll(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strconv.Quote(v)
	}
	return out
}

// TestFlagDefaultsTable: every row of the table of defaults in
// docs/operations.md ("Running the stages") gives each flag's default as
// the stages' flags have it, and every default a stage gives the flag
// (100ms, and the sink's 1s): a default changed in the code cannot stay
// in the table, where an operator reads what a flag left out means.
func TestFlagDefaultsTable(t *testing.T) {
	_, files, _ := docs(t)
	defaults := stageDefaults(t)
	rows := 0
	for _, l := range section(t, files, "docs/operations.md", "Running the stages") {
		cells := strings.Split(l, " | ")
		if !strings.HasPrefix(l, "| `--") || len(cells) < 3 || strings.Contains(cells[0], "…") {
			continue
		}
		rows++
		for _, p := range defaultsProblems(defaults, cells[0], cells[1]) {
			t.Errorf("docs/operations.md, table of defaults, %s: %s", strings.TrimPrefix(cells[0], "| "), p)
		}
	}
	if rows < 20 {
		t.Fatalf("read %d rows of the table of defaults", rows)
	}
}

// TestDefaultsProblems: a value that is no default, a flag the stages do
// not have and a stage's default left out are found; another form of the
// same value (60s for 1m, 10,000) is not a problem.
func TestDefaultsProblems(t *testing.T) {
	defaults := map[string][]string{"commit-interval": {"100ms", "1s"}, "rebalance-timeout": {"30s", "1m0s"},
		"session-timeout": {"10s"}, "max-batch-records": {"10000", "50000"}, "meters": {""}, "strict-meters": {""}}
	for _, c := range []struct {
		flags, cell string
		problems    int
	}{
		{"`--commit-interval`", "100ms (sink: 1s)", 0},
		{"`--session-timeout`, `--rebalance-timeout`", "10s, 30s (sink: 60s)", 0},
		{"`--max-batch-records`", "10,000 (aggregator and sink: 50,000)", 0},
		{"`--meters`, `--strict-meters`", "none, off", 0},
		{"`--commit-interval`", "200ms (sink: 1s)", 2},
		{"`--commit-interval`", "100ms", 1},
		{"`--session-timeout`, `--rebalance-timeout`", "10s (sink: 60s)", 1},
		{"`--comit-interval`", "100ms", 1},
	} {
		if got := defaultsProblems(defaults, c.flags, c.cell); len(got) != c.problems {
			t.Errorf("%s | %s: %q, want %d problems", c.flags, c.cell, got, c.problems)
		}
	}
}
