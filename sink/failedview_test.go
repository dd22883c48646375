package sink

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestFailedViewOfOneRowNotParked: the view of invoice_lines that reads
// usage_adjustments fails (made to throw on a crafted customer) for an
// INSERT of a single row, a late event alone in its window. ClickHouse
// wrote the row to usage_adjustments, then the view failed: the INSERT
// is refused, and the row is in the ledger. It must not be parked too: a
// parked adjustment is late usage that no invoice run bills
// (docs/analysts.md, Invoicing exactly once), so an invoice job bills it
// besides the run that bills its row, twice.
func TestFailedViewOfOneRowNotParked(t *testing.T) {
	e := newEnv(t, 1)
	r := e.start(nil)
	ctx := ctxT(t, 5*time.Minute)
	poisonView(ctx, t, e, TableAdjustments, " delta,", " delta + throwIf(customer_id = 'poison') AS delta,")
	ms := func(s string) int64 { v, _ := time.Parse(time.DateTime, s); return v.UnixMilli() }
	at := time.Date(2024, 2, 3, 10, 0, 0, 0, time.UTC)
	late := &schemas.Adjustment{EventID: "late-1", CustomerID: "poison", Meter: "api_calls", Aggregation: "SUM",
		OriginalPeriodStart: ms("2024-01-01 00:00:00"), OriginalPeriodEnd: ms("2024-02-01 00:00:00"),
		BookedPeriodStart: ms("2024-02-01 00:00:00"), BookedPeriodEnd: ms("2024-03-01 00:00:00"),
		Delta: 5, Quantity: 5, EventTime: ms("2024-01-31 10:00:00"), IngestTime: at.UnixMilli()}
	e.produce(&kgo.Record{Topic: e.names.AdjustmentsTopic(), Partition: 0, Key: []byte("poison/api_calls"), Value: schemas.MustEncode(late), Timestamp: at})
	e.waitCaughtUp(time.Minute, e.names.AdjustmentsTopic())
	if n := metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableAdjustments, "kind", "refused"); n == 0 {
		t.Fatal("the poisoned view never failed an INSERT into usage_adjustments: the test proves nothing")
	}
	e.exact(TableAdjustments, 1)
	if n := metric(t, r.reg, "meterline_sink_rows_total", "outcome", "parked"); n != 0 {
		t.Errorf("%v row(s) parked in %s: the row is in %s, and an invoice job would bill it twice", n, e.names.RejectedTopic(), TableAdjustments)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// poisonView replaces the view of e's database that reads table with one
// whose SELECT has poisoned in place of clause: it throws on the rows it
// names.
func poisonView(ctx context.Context, t *testing.T, e *env, table, clause, poisoned string) {
	t.Helper()
	ds, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	var view View
	for _, d := range ds {
		for _, v := range d.Views {
			if v.Source == table && strings.Contains(v.Select, clause) {
				view = v
			}
		}
	}
	if view.Name == "" {
		t.Fatalf("no view of %s with %q to poison", table, clause)
	}
	sel := strings.Replace(view.Select, clause, poisoned, 1)
	for _, q := range []string{"DROP TABLE " + e.db + "." + view.Name,
		"CREATE MATERIALIZED VIEW " + e.db + "." + view.Name + " TO " + e.db + "." + view.Target + " AS " +
			fromTable.ReplaceAllString(sel, "FROM "+e.db+".$1")} {
		if err := e.conn.Exec(ctx, q); err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
	}
}

// TestFailedViewOfOneRejectionNotQuarantined: the view of unbilled_events
// fails for an INSERT of a single row of usage_rejected, an aggregator's
// rejection alone in its window. The row is in usage_rejected; it must
// not be in usage_quarantine too (a record of usage.rejected is a row of
// one of them, never both), where an operator would take it for a
// rejection ClickHouse could not hold.
func TestFailedViewOfOneRejectionNotQuarantined(t *testing.T) {
	e := newEnv(t, 1)
	r := e.start(nil)
	ctx := ctxT(t, 5*time.Minute)
	poisonView(ctx, t, e, TableRejected, " reason,", " reason || toString(throwIf(customer_id = 'poison')) AS reason,")
	at := time.Date(2024, 2, 3, 10, 0, 0, 0, time.UTC)
	rej := &schemas.Rejected{Reason: "over_limit", Stage: "aggregator", SourceTopic: e.names.DedupedTopic(), SourceOffset: 7,
		CustomerID: "poison", Meter: "api_calls", EventID: "e-1"}
	e.produce(&kgo.Record{Topic: e.names.RejectedTopic(), Partition: 0, Key: []byte("poison/api_calls/e-1"), Value: schemas.MustEncode(rej), Timestamp: at})
	e.waitCaughtUp(time.Minute, e.names.RejectedTopic())
	if n := metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableRejected, "kind", "refused"); n == 0 {
		t.Fatal("the poisoned view never failed an INSERT into usage_rejected: the test proves nothing")
	}
	e.exact(TableRejected, 1)
	if n := e.count(TableQuarantine); n != 0 {
		t.Errorf("%d row(s) in %s: the record is a row of %s", n, TableQuarantine, TableRejected)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}
