package sink

import (
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestDropViewsKeeps drops every analyst view but the ones named, and
// refuses a name that is no analyst view without dropping anything.
func TestDropViewsKeeps(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	views := func() string {
		r, err := tsv(ctx, conn, "SELECT name FROM system.tables WHERE database = '"+db+"' AND engine = 'MaterializedView' ORDER BY name")
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(strings.TrimSpace(r), "\n", " ")
	}
	all := views()
	if strings.Count(all, " ") < 5 {
		t.Fatalf("views after the migrations: %s", all)
	}
	if err := DropViews(ctx, conn, "usage_daily_mv", "no_such_mv"); err == nil || !strings.Contains(err.Error(), "no_such_mv") {
		t.Fatalf("DropViews with an unknown view: %v", err)
	}
	if got := views(); got != all {
		t.Fatalf("a refused DropViews dropped views: %s, was %s", got, all)
	}
	if err := DropViews(ctx, conn, "usage_daily_mv", "events_by_customer_mv"); err != nil {
		t.Fatal(err)
	}
	if got := views(); got != "events_by_customer_mv usage_daily_mv" {
		t.Errorf("views kept: %s", got)
	}
	if err := DropViews(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := views(); got != "" {
		t.Errorf("views left after dropping all: %s", got)
	}
}
