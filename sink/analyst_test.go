package sink

import (
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// TestDerivedTablesCoverTheViews: every materialized view of the
// migrations writes a derived table that verify knows how to check, each
// derived table has its views and they read exactly its sources, and a
// rebuild's fill reads the source with FINAL and keeps only the months
// asked for.
func TestDerivedTablesCoverTheViews(t *testing.T) {
	ds, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != len(derivedSpecs) {
		t.Fatalf("%d derived tables, %d specs", len(ds), len(derivedSpecs))
	}
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// A view is counted once however many migrations define it; a
	// migration that defines a view an earlier one created must drop it
	// first (CREATE ... IF NOT EXISTS would keep the old one).
	created := map[string]bool{}
	for _, m := range ms {
		dropped := map[string]bool{}
		for _, s := range m.Statements {
			if name, ok := strings.CutPrefix(s, "DROP TABLE IF EXISTS "); ok {
				dropped[strings.TrimSpace(name)] = true
			}
			sm := createView.FindStringSubmatch(s)
			if sm == nil {
				continue
			}
			if created[sm[1]] && !dropped[sm[1]] {
				t.Errorf("%s defines view %s again without dropping it first", m.Name, sm[1])
			}
			created[sm[1]] = true
		}
	}
	views := len(created)
	n := 0
	for _, d := range ds {
		n += len(d.Views)
		for _, v := range d.Views {
			staging := stagingTable(d.Name, "verify 2024-04-01T00:00:00Z 0a1b2c3d")
			if !regexp.MustCompile(`^rebuild__` + d.Name + `__[0-9a-f]{16}$`).MatchString(staging) {
				t.Errorf("%s: staging table %q", d.Name, staging)
			}
			fill := v.fillSQL("db", staging, d.PartitionColumn, []uint32{202401, 202403})
			if !strings.Contains(fill, "FROM db."+v.Source+" FINAL") || !strings.HasPrefix(fill, "INSERT INTO db."+staging+" SELECT * FROM (") ||
				!strings.HasSuffix(fill, "WHERE toYYYYMM("+d.PartitionColumn+") IN (202401, 202403)") {
				t.Errorf("%s: fill:\n%s", v.Name, fill)
			}
		}
		if !strings.Contains(d.Derived, "%[1]s."+d.Name+" ") || !strings.Contains(d.Ledger, "%[1]s.") {
			t.Errorf("%s: the comparison queries do not read the table and the ledger", d.Name)
		}
	}
	if n != views {
		t.Errorf("the migrations create %d views, the derived tables know %d", views, n)
	}
}

// A view whose target verify does not know, or that reads two tables, is
// refused.
func TestDerivedTablesRefuseUnknownViews(t *testing.T) {
	for name, sql := range map[string]string{
		"unknown target": "CREATE MATERIALIZED VIEW IF NOT EXISTS x_mv TO x AS\nSELECT a FROM usage_events;\n",
		"two tables":     "CREATE MATERIALIZED VIEW IF NOT EXISTS y_mv TO usage_daily AS\nSELECT a FROM usage_events WHERE a IN (SELECT a FROM usage_rejected);\n",
		"no TO":          "CREATE MATERIALIZED VIEW z_mv ENGINE = Memory AS SELECT a FROM usage_events;\n",
	} {
		ms, err := chschema.Parse(fstest.MapFS{"001_a.sql": {Data: []byte(sql)}})
		if err != nil {
			t.Fatal(err)
		}
		views, err := parseViews(ms)
		if err == nil {
			_, err = checkViews(views)
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestQueryFor(t *testing.T) {
	p := QueryParams{Customer: "cust-7", Meter: "tokens", Month: time.Date(2024, 12, 1, 0, 0, 0, 0, time.UTC)}
	for _, q := range AnalystQueries {
		sql, err := q.For(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, ex := range []string{exampleCustomer, exampleMeter, exampleMonth, exampleNextMonth} {
			if strings.Contains(sql, ex) {
				t.Errorf("%s: %s left in\n%s", q.Name, ex, sql)
			}
		}
		if strings.Contains(q.SQL, exampleNextMonth) && !strings.Contains(sql, "2025-01-01") {
			t.Errorf("%s: the next month of December 2024 is January 2025:\n%s", q.Name, sql)
		}
	}
	if _, err := AnalystQueries[0].For(QueryParams{Customer: "x", Meter: "m", Month: time.Date(2024, 1, 2, 0, 0, 0, 0, time.UTC)}); err == nil {
		t.Error("a month not starting on its first day was accepted")
	}
	if _, err := AnalystQueries[0].For(QueryParams{Customer: "o'brien", Meter: "m", Month: p.Month}); err == nil {
		t.Error("a quote in a customer was accepted")
	}
}

func TestNextMonth(t *testing.T) {
	for in, want := range map[uint32]uint32{202401: 202402, 202411: 202412, 202412: 202501} {
		if got := nextMonth(in); got != want {
			t.Errorf("nextMonth(%d) = %d, want %d", in, got, want)
		}
	}
}

// The generated data set is only integer arithmetic, so that every
// ClickHouse version generates the same rows.
func TestSyntheticDataIsIntegerOnly(t *testing.T) {
	stmts := SyntheticData{Events: 25, Revisions: 40, Customers: 3, Months: 2, Partitions: 2, Chunk: 10}.Statements("db")
	if len(stmts) != 3*5+1+1 { // 3 chunks of each of events, duplicates, adjustments and the two rejections; a chunk of OPEN revisions, the FINAL ones
		t.Errorf("%d statements", len(stmts))
	}
	for _, s := range stmts {
		for _, f := range []string{"rand", "exp(", "log(", "pow(", "now()", "today()", "/ "} {
			if strings.Contains(s, f) {
				t.Errorf("%q in a generating statement:\n%s", f, s)
			}
		}
	}
}
