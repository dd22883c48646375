package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
)

// Verify's measures on sums past 64 bits. The data is hostileSumsInserts',
// written through views that flip the sign bit of each value, delta and
// quantity they copy (a row then differs from its ledger row by exactly
// 2^63, so two rows of a month by 2^64): the derived tables hold -1 where
// the ledger holds MaxInt64. Summed in Int64, both sides wrap to the same
// number and the month looks equal; summed exactly, verify reports it
// differs, with the ledger's true total. Only the adjustments booked into
// February are flipped: January has one, whose flip alone would show even
// in Int64.

// signFlip moves an Int64 by 2^63 (bitXor with the sign bit).
const signFlip = "bitXor(%s, toInt64('-9223372036854775808'))"

// flippedViews returns the statements that replace the views of
// events_by_customer, aggregates_current and invoice_lines by flipping
// ones, and those that put the migrations' views back.
func flippedViews(t *testing.T) (flip, restore []string) {
	t.Helper()
	return editedViews(t, map[string][2]string{
		"events_by_customer_mv": {"quantity, source", fmt.Sprintf(signFlip, "quantity") + " AS quantity, source"},
		"aggregates_current_mv": {"status, value, event_count", "status, " + fmt.Sprintf(signFlip, "value") + " AS value, event_count"},
		"invoice_lines_usage_mv": {"value, toInt64(0) AS delta",
			fmt.Sprintf(signFlip, "value") + " AS value, toInt64(0) AS delta"},
		"invoice_lines_adjustments_mv": {"delta, original_period_start",
			"if(toYYYYMM(booked_period_start) = 202402, " + fmt.Sprintf(signFlip, "delta") + ", delta) AS delta, original_period_start"},
	})
}

// flippedWant: per table and month, the measures (by index) that differ,
// as {ledger, derived}. 18446744073709551614 is 2 × MaxInt64,
// 18446744073709551600 is 2 × (MaxInt64 - 7). Every other measure of
// these months, and every month of the other tables, is equal.
var flippedWant = map[string]map[int][2]string{
	"events_by_customer/202401": {1: {"18446744073709551614", "-2"}},
	"aggregates_current/202401": {1: {"18446744073709551614", "-2"}},
	"invoice_lines/202401":      {1: {"18446744073709551614", "-2"}, 3: {"18446744073709551614", "-2"}},
	"invoice_lines/202402":      {5: {"18446744073709551600", "-16"}},
}

// checkFlipped compares one month's measures with flippedWant.
func checkFlipped(t *testing.T, key string, ledger, derived []string) {
	t.Helper()
	want := flippedWant[key]
	if len(ledger) != len(derived) {
		t.Errorf("%s: ledger %v, derived %v", key, ledger, derived)
		return
	}
	for i := range ledger {
		if w, ok := want[i]; ok {
			if ledger[i] != w[0] || derived[i] != w[1] {
				t.Errorf("%s measure %d: ledger %s, derived %s; want %s and %s", key, i, ledger[i], derived[i], w[0], w[1])
			}
		} else if ledger[i] != derived[i] {
			t.Errorf("%s measure %d: ledger %s, derived %s; want them equal", key, i, ledger[i], derived[i])
		}
	}
}

// TestVerifySumsExactly: on ClickHouse 18.16, verify reports the months
// whose sums differ by a multiple of 2^64 as differing, with the exact
// sums.
func TestVerifySumsExactly(t *testing.T) {
	flip, restore := flippedViews(t)
	conn, db, ctx := migratedDB(t, func(db string) []string {
		return append(append(flip, hostileSumsInserts(db)...), restore...)
	})
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202312, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	differing := map[string]bool{}
	for key := range flippedWant {
		differing[key] = true
	}
	checkMonths(t, rep.Months, differing, func(key string, m MonthCheck) { checkFlipped(t, key, m.Ledger, m.Derived) })
}

// checkMonths checks that the months of differing (table/YYYYMM) were
// compared and differ and every other month is equal, and calls each
// (if not nil) on every month.
func checkMonths(t *testing.T, months []MonthCheck, differing map[string]bool, each func(key string, m MonthCheck)) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range months {
		key := fmt.Sprintf("%s/%d", m.Table, m.Month)
		seen[key] = true
		want := MonthEqual
		if differing[key] {
			want = MonthDiffers
		}
		if m.Status != want {
			t.Errorf("%s: %s, want %s (ledger %v, derived %v)", key, m.Status, want, m.Ledger, m.Derived)
		}
		if each != nil {
			each(key, m)
		}
	}
	for key := range differing {
		if !seen[key] {
			t.Errorf("%s not compared", key)
		}
	}
}

// TestVerifySumsExactlyOnChdb runs verify's measures of the same data on
// current ClickHouse (chdb, 26.x).
func TestVerifySumsExactlyOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "verifysums"
	flip, restore := flippedViews(t)
	stmts := append(migrationStatements(t), flip...)
	stmts = append(append(stmts, hostileSumsInserts(db)...), restore...)
	resp, ds := chdbMeasures(t, python, db, stmts, nil)
	months := func(tsv string) map[string][]string {
		out := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSuffix(tsv, "\n"), "\n") {
			if line != "" {
				f := strings.Split(line, "\t")
				out[f[0]] = f[1:]
			}
		}
		return out
	}
	seen := map[string]bool{}
	for i, d := range ds {
		led, der := months(resp.Results[2*i]), months(resp.Results[2*i+1])
		for m, l := range led {
			key := d.Name + "/" + m
			seen[key] = true
			checkFlipped(t, key, l, der[m])
		}
		if len(der) != len(led) {
			t.Errorf("%s on chdb %s: ledger months %v, derived %v", d.Name, resp.Version, led, der)
		}
	}
	for key := range flippedWant {
		if !seen[key] {
			t.Errorf("%s not compared on chdb %s", key, resp.Version)
		}
	}
}

// chdbMeasures runs stmts in chdb, then queries, then verify's Ledger and
// Derived measures of each derived table: resp.Results holds the answers
// to queries, then those of the measures, two per table of ds.
func chdbMeasures(t *testing.T, python, db string, stmts, queries []string) (resp chdbResponse, ds []DerivedTable) {
	t.Helper()
	ds, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	req := chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts, Queries: queries}
	for _, d := range ds {
		req.Queries = append(req.Queries, fmt.Sprintf(d.Ledger, db), fmt.Sprintf(d.Derived, db))
	}
	resp, err = runChdb(ctxT(t, 5*time.Minute), python, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != len(req.Queries) {
		t.Fatalf("chdb %s answered %d queries of %d", resp.Version, len(resp.Results), len(req.Queries))
	}
	return resp, ds
}
