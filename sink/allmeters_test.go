package sink

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// allMetersEdit is the sentence of docs/analysts.md that tells how to add
// the meters up in "A customer's billable usage by day", and the clauses
// it names.
var allMetersEdit = regexp.MustCompile("Drop `meter` from the (?:outer )?((?:`[A-Z ]+`(?:,\\s+|\\s+and\\s+)?)+)\\s+to add\\s+the meters up")

// documentedAllMetersClauses returns the clauses of the outer query that
// docs/analysts.md says to drop `meter` from.
func documentedAllMetersClauses(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/analysts.md")
	if err != nil {
		t.Fatal(err)
	}
	m := allMetersEdit.FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("docs/analysts.md no longer says how to add the meters up (%s)", allMetersEdit)
	}
	var clauses []string
	for _, c := range regexp.MustCompile("`([A-Z ]+)`").FindAllStringSubmatch(m[1], -1) {
		clauses = append(clauses, c[1])
	}
	return clauses
}

// allMetersVariant is usage_by_day edited as docs/analysts.md says:
// `meter` dropped from the given clauses of the outer query (its first
// line, and the lines after the subquery's closing parenthesis).
func allMetersVariant(t *testing.T, clauses []string) string {
	t.Helper()
	lines := strings.Split(usageByDay(t), "\n")
	outer := false
	for i, l := range lines {
		first := strings.HasPrefix(l, "SELECT day, meter,")
		if l == ")" {
			outer = true
		}
		if !first && !outer {
			continue
		}
		for _, c := range clauses {
			if strings.HasPrefix(l, c+" ") {
				lines[i] = strings.Replace(l, "day, meter", "day", 1)
			}
		}
	}
	return strings.Join(lines, "\n")
}

// allMetersWant: twoCopiesWant with the meters added up (there is one).
const allMetersWant = "2024-01-10\t2\t10\n2024-01-11\t1\t1\n"

// TestUsageByDayAllMeters: the edit docs/analysts.md gives to add the
// meters up in usage_by_day runs on ClickHouse 18.16 and gives the
// day's totals.
func TestUsageByDayAllMeters(t *testing.T) {
	checkQuery1816(t, twoCopiesInserts, allMetersVariant(t, documentedAllMetersClauses(t)), allMetersWant)
}

// TestUsageByDayAllMetersOnChdb is TestUsageByDayAllMeters on current
// ClickHouse (chdb, 26.x).
func TestUsageByDayAllMetersOnChdb(t *testing.T) {
	checkQueryChdb(t, "allmeters", twoCopiesInserts, allMetersVariant(t, documentedAllMetersClauses(t)), allMetersWant)
}
