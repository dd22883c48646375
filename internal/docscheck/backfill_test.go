package docscheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// backfillParagraph returns the paragraph of docs/operations.md, "Verify
// and backfill", that begins "**Backfill.**": the migrations that record
// a backfill, which keeps the sink from starting until it is done.
func backfillParagraph(t *testing.T, files map[string]string) string {
	t.Helper()
	var para []string
	for _, l := range section(t, files, "docs/operations.md", "Verify and backfill") {
		switch {
		case strings.HasPrefix(l, "**Backfill.**"):
			para = append(para, l)
		case len(para) > 0 && strings.TrimSpace(l) == "":
			return strings.Join(para, "\n")
		case len(para) > 0:
			para = append(para, l)
		}
	}
	if len(para) == 0 {
		t.Fatal(`docs/operations.md, Verify and backfill, has no paragraph "**Backfill.**"`)
	}
	return strings.Join(para, "\n")
}

// TestBackfillMigrationsDocumented: every migration that records a
// backfill (an INSERT into meterline_rebuilds, after which the sink
// refuses to start until `meterline verify --backfill` has run) is named
// in the paragraph of operations.md that lists them: an operator who
// upgrades reads there why the sink stopped and what to run.
func TestBackfillMigrationsDocumented(t *testing.T) {
	root, files, _ := docs(t)
	para := backfillParagraph(t, files)
	migrations, err := filepath.Glob(filepath.Join(root, "schemas", "clickhouse", "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range migrations {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "INSERT INTO meterline_rebuilds") {
			continue
		}
		n++
		if name := filepath.Base(m); !strings.Contains(para, "`"+name+"`") {
			t.Errorf("migration %s records a backfill, and docs/operations.md (Verify and backfill, \"**Backfill.**\") does not name it", name)
		}
	}
	if n < 2 {
		t.Fatalf("found %d migrations that record a backfill", n)
	}
}
