package sink

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
)

// Verify's measures cover what the documented queries read, not only row
// counts and keys: a month whose rows are all there, with the right keys
// and revisions, but other values than the ledger's, differs. The data is
// written through views edited to change one column the queries read
// (docs/entitlements.md, Balances in ClickHouse: meter_usage and
// grant_remaining; docs/analysts.md, late usage: original_period_start),
// as a change by hand would.

// editedViews returns the statements that replace each named view's
// SELECT, edited by replacing old with new, and those that put the
// migrations' views back.
func editedViews(t *testing.T, edits map[string][2]string) (edit, restore []string) {
	t.Helper()
	ds, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for name := range edits {
		left[name] = true
	}
	for _, d := range ds {
		for _, v := range d.Views {
			e, ok := edits[v.Name]
			if !ok {
				continue
			}
			sel := strings.Replace(v.Select, e[0], e[1], 1)
			if sel == v.Select {
				t.Fatalf("view %s: no %q to replace", v.Name, e[0])
			}
			edit = append(edit, "DROP TABLE "+v.Name, "CREATE MATERIALIZED VIEW "+v.Name+" TO "+v.Target+" AS "+sel)
			restore = append(restore, "DROP TABLE "+v.Name, "CREATE MATERIALIZED VIEW "+v.Name+" TO "+v.Target+" AS "+v.Select)
			delete(left, v.Name)
		}
	}
	if len(left) != 0 {
		t.Fatalf("views not found: %v", left)
	}
	return edit, restore
}

// contentEdits change acme's usage in balances_current and the original
// period of every adjustment in invoice_lines.
var contentEdits = map[string][2]string{
	"balances_current_mv": {"meter_usage, meter_limits", "arrayMap(u -> u + 1, meter_usage) AS meter_usage, meter_limits"},
	"invoice_lines_adjustments_mv": {"delta, original_period_start",
		"delta, booked_period_start AS original_period_start"},
}

// contentDiffers are the tables whose January 2024 contentEdits change.
var contentDiffers = map[string]bool{TableBalancesCurrent: true, TableInvoiceLines: true}

// contentInserts: two balances of acme in January 2024 (revision 2 is its
// current one) and one of globex, and two adjustments of December's usage
// booked into January.
func contentInserts(db string) []string {
	bal := func(off int, cust string, rev int, usage, remaining int) string {
		return fmt.Sprintf("SELECT 'usage.balances' AS t, toInt32(0) AS p, toInt64(%d) AS o, toDateTime('2024-01-10 00:00:00') AS ts, "+
			"'%s' AS c, 'free' AS pl, toInt64(%d) AS r, toDateTime('2024-01-01 00:00:00') AS ps, toDateTime('2024-02-01 00:00:00') AS pe, "+
			"['api_calls'] AS mn, [toInt64(%d)] AS mu, [toInt64(1000)] AS ml, ['reject'] AS mo, ['promo'] AS gi, [toInt64(%d)] AS gr",
			off, cust, rev, usage, remaining)
	}
	adj := func(off int, id string, delta int) string {
		return fmt.Sprintf("SELECT '%s' AS t, toInt32(0) AS p, toInt64(%d) AS o, toDateTime('2024-01-03 00:00:00') AS ts, "+
			"'%s' AS e, 'acme' AS c, 'api_calls' AS m, '{}' AS g, 'SUM' AS a, toDateTime('2023-12-01 00:00:00') AS ops, "+
			"toDateTime('2024-01-01 00:00:00') AS ope, toDateTime('2024-01-01 00:00:00') AS bps, toDateTime('2024-02-01 00:00:00') AS bpe, "+
			"toInt64(%d) AS d, toInt64(%d) AS q, toInt64(%d) AS ro", TableAdjustments, off, id, delta, delta, off)
	}
	return []string{
		"INSERT INTO " + db + ".usage_balances (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, plan, revision, " +
			"period_start, period_end, meter_names, meter_usage, meter_limits, meter_on_limit, grant_ids, grant_remaining) SELECT * FROM (" +
			bal(1, "acme", 1, 500, 900) + " UNION ALL " + bal(2, "acme", 2, 850, 300) + " UNION ALL " + bal(3, "globex", 1, 100, 50) + ")",
		"INSERT INTO " + db + ".usage_adjustments (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, customer_id, meter, " +
			"group_key, aggregation, original_period_start, original_period_end, booked_period_start, booked_period_end, delta, quantity, " +
			"record_offset) SELECT * FROM (" + adj(1, "late-1", 4) + " UNION ALL " + adj(2, "late-2", 6) + ")",
	}
}

// TestVerifyComparesContent: on ClickHouse 18.16, a month of
// balances_current whose usage and credits left differ from the ledger's,
// and a month of invoice_lines whose adjustments name another original
// period, differ; every other month is equal.
func TestVerifyComparesContent(t *testing.T) {
	checkEditedMonths(t, contentEdits, contentInserts, contentDiffers)
}

// TestVerifyComparesContentOnChdb computes verify's measures of the same
// data on current ClickHouse (chdb, 26.x): the same tables differ, the
// others are equal.
func TestVerifyComparesContentOnChdb(t *testing.T) {
	checkEditedMeasuresChdb(t, "verifycontent", contentEdits, contentInserts, contentDiffers)
}

// checkEditedMonths writes the statements of inserts through the views
// edited by edits (editedViews) on ClickHouse 18.16, and checks that
// verify finds January 2024 of the tables of differs differing and every
// other month equal.
func checkEditedMonths(t *testing.T, edits map[string][2]string, inserts func(db string) []string, differs map[string]bool) {
	t.Helper()
	edit, restore := editedViews(t, edits)
	conn, db, ctx := migratedDB(t, func(db string) []string {
		return append(append(edit, inserts(db)...), restore...)
	})
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202312, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	differing := map[string]bool{}
	for name := range differs {
		differing[name+"/202401"] = true
	}
	checkMonths(t, rep.Months, differing, nil)
}

// checkEditedMeasuresChdb is checkEditedMonths on chdb (ClickHouse
// 26.x), in database db, with verify's measures: those of the tables of
// differs differ, in January 2024, the others are equal.
func checkEditedMeasuresChdb(t *testing.T, db string, edits map[string][2]string, inserts func(db string) []string, differs map[string]bool) {
	t.Helper()
	python := testenv.Chdb(t)
	edit, restore := editedViews(t, edits)
	stmts := append(migrationStatements(t), edit...)
	stmts = append(append(stmts, inserts(db)...), restore...)
	resp, ds := chdbMeasures(t, python, db, stmts, nil)
	for i, d := range ds {
		led, der := resp.Results[2*i], resp.Results[2*i+1]
		if (led != der) != differs[d.Name] {
			t.Errorf("%s on chdb %s: ledger\n%s derived\n%s want differing %v", d.Name, resp.Version, led, der, differs[d.Name])
		}
		if differs[d.Name] && !strings.HasPrefix(led, "202401\t") {
			t.Errorf("%s on chdb %s: ledger %q, want January 2024", d.Name, resp.Version, led)
		}
	}
}
