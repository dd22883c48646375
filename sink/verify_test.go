package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// scalar runs a query of one UInt64.
func (e *env) scalar(q string) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.conn.QueryRow(ctxT(e.t, time.Minute), q).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// derivedCounts are the event counts of the tables fed by usage_events,
// as analysts read them.
func (e *env) derivedCounts() [3]uint64 {
	return [3]uint64{
		e.scalar("SELECT count() FROM " + e.db + ".events_by_customer FINAL"),
		e.scalar("SELECT toUInt64(sum(events)) FROM " + e.db + ".usage_daily"),
		e.scalar("SELECT toUInt64(sum(accepted)) FROM " + e.db + ".source_daily"),
	}
}

func (e *env) verifyConfig(repair bool) VerifyConfig {
	return VerifyConfig{Conn: e.conn, Database: e.db, Repair: repair, Logger: zaptest.NewLogger(e.t),
		SinkMembers: GroupMembers(testenv.Admin(e.t, e.brokers), e.group)}
}

func statuses(rep *VerifyReport) map[string]string {
	out := map[string]string{}
	for _, m := range rep.Months {
		out[fmt.Sprintf("%s/%d", m.Table, m.Month)] = m.Status
	}
	return out
}

// TestVerifyRepairsAFailedView makes a view throw (throwIf) on a crafted
// value while the real sink writes: ClickHouse writes the ledger table,
// then fails in the view; the sink splits the refused block, finds every
// row in the ledger and skips them, so the derived table stays short. verify
// finds the month, refuses to rebuild while the sink runs, and rebuilds it
// once the sink stopped; afterwards every derived table equals the ledger.
// A zombie's duplicate ledger row (summed twice by the rollups) is found
// and repaired the same way.
func TestVerifyRepairsAFailedView(t *testing.T) {
	e := newEnv(t, 2)
	jan := time.Date(2024, 1, 10, 0, 0, 0, 0, time.UTC)
	feb := time.Date(2024, 2, 10, 0, 0, 0, 0, time.UTC)
	batch := func(n int, start time.Time, offset int) []*kgo.Record {
		var recs []*kgo.Record
		for p := int32(0); p < e.parts; p++ {
			for i := 0; i < n; i++ {
				recs = append(recs, deduped(e.names.DedupedTopic(), p, offset+i, start.Add(time.Duration(i)*time.Minute)))
			}
		}
		return recs
	}
	r := e.start(nil)
	e.produce(batch(50, jan, 0)...)
	e.waitCaughtUp(time.Minute, e.names.DedupedTopic())
	if got := e.derivedCounts(); got != [3]uint64{100, 100, 100} {
		t.Fatalf("derived counts after January: %v, want 100 each", got)
	}

	// The view of events_by_customer, made to throw on a crafted value: a
	// February block that holds it is written to usage_events, then the
	// view fails. The sink sees a refused block, splits it, finds every
	// row in the ledger and skips them all.
	ctx := ctxT(t, 5*time.Minute)
	view := derivedView(t, TableEventsByCustomer)
	poisoned := strings.Replace(view.Select, "quantity,", "quantity + throwIf(customer_id = 'poison') AS quantity,", 1)
	if poisoned == view.Select {
		t.Fatal("the view's SELECT has no 'quantity,' to poison")
	}
	for _, q := range []string{"DROP TABLE " + e.db + "." + view.Name,
		"CREATE MATERIALIZED VIEW " + view.Name + " TO " + view.Target + " AS " + poisoned} {
		if err := e.conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	refusedBefore := metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableEvents, "kind", "refused")
	recs := batch(30, feb, 50)
	poison := &schemas.DedupedEvent{EventID: "poison-1", CustomerID: "poison", Meter: "api_calls", Quantity: 1,
		EventTime: feb.UnixMilli(), Source: "gw", IngestTime: feb.UnixMilli()}
	recs = append(recs, &kgo.Record{Topic: e.names.DedupedTopic(), Partition: 0, Key: []byte("poison/api_calls"), Value: schemas.MustEncode(poison), Timestamp: feb})
	e.produce(recs...)
	deadline := time.Now().Add(time.Minute)
	for metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableEvents, "kind", "refused") == refusedBefore {
		if time.Now().After(deadline) {
			t.Fatal("the poisoned view never failed an INSERT into usage_events")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.waitCaughtUp(time.Minute, e.names.DedupedTopic())
	// The view as the migration defines it, again.
	for _, q := range []string{"DROP TABLE " + e.db + "." + view.Name,
		"CREATE MATERIALIZED VIEW " + view.Name + " TO " + view.Target + " AS " + view.Select} {
		if err := e.conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	e.exact(TableEvents, 161)
	if n := metric(t, r.reg, "meterline_sink_rows_total", "outcome", "parked"); n != 0 {
		t.Fatalf("%v rows parked: the ledger took every row", n)
	}
	short := e.derivedCounts()
	if short[0] >= 161 {
		t.Fatalf("events_by_customer has %d rows: the failed view lost nothing, so the test proves nothing", short[0])
	}
	t.Logf("after the failed view: ledger 161 events, derived (events_by_customer, usage_daily, source_daily) %v", short)

	// A compare is allowed while the sink runs; a rebuild is not.
	rep, err := Verify(ctx, e.verifyConfig(false))
	if err != nil {
		t.Fatal(err)
	}
	st := statuses(rep)
	if st["events_by_customer/202402"] != MonthDiffers || rep.Differs == 0 {
		t.Fatalf("dry run: %v", st)
	}
	if st["events_by_customer/202401"] != MonthSkipped {
		t.Fatalf("January is the ledger's oldest month: want it skipped by default, got %q", st["events_by_customer/202401"])
	}
	if _, err := Verify(ctx, e.verifyConfig(true)); !errors.Is(err, ErrSinkRunning) {
		t.Fatalf("repair while the sink runs: %v, want ErrSinkRunning", err)
	}
	if err := CheckRebuilds(ctx, e.conn); err != nil {
		t.Fatalf("a refused rebuild must not block the sink: %v", err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	waitNoMembers(t, e)

	rep, err = Verify(ctx, e.verifyConfig(true))
	if err != nil {
		t.Fatal(err)
	}
	st = statuses(rep)
	for _, tbl := range []string{TableEventsByCustomer, TableUsageDaily, TableSourceDaily} {
		k := tbl + "/202402"
		if tbl == TableEventsByCustomer && st[k] != MonthRebuilt {
			t.Errorf("%s: %q, want rebuilt", k, st[k])
		}
		if st[k] != MonthRebuilt && st[k] != MonthEqual {
			t.Errorf("%s: %q after the repair", k, st[k])
		}
	}
	if rep.Differs != 0 || rep.Rebuilt == 0 {
		t.Fatalf("repair: %d differ, %d rebuilt: %v", rep.Differs, rep.Rebuilt, st)
	}
	if got := e.derivedCounts(); got != [3]uint64{161, 161, 161} {
		t.Fatalf("derived counts after the repair: %v, want 160 each", got)
	}
	if n := e.scalar("SELECT count() FROM system.tables WHERE database = '" + e.db + "' AND name LIKE 'rebuild\\_\\_%'"); n != 0 {
		t.Errorf("%d staging tables left behind", n)
	}

	// A zombie sink's duplicate of a February row: the ledger collapses it,
	// the rollups summed it.
	if err := e.conn.Exec(ctx, "INSERT INTO "+e.db+".usage_events SELECT * FROM "+e.db+".usage_events WHERE kafka_partition = 1 AND kafka_offset = 60"); err != nil {
		t.Fatal(err)
	}
	if got := e.scalar("SELECT toUInt64(sum(events)) FROM " + e.db + ".usage_daily"); got != 162 {
		t.Fatalf("usage_daily after the zombie's row: %d, want 162 (the rollup sums it)", got)
	}
	rep, err = Verify(ctx, e.verifyConfig(true))
	if err != nil {
		t.Fatal(err)
	}
	st = statuses(rep)
	if st["usage_daily/202402"] != MonthRebuilt || st["events_by_customer/202402"] != MonthEqual || rep.Differs != 0 {
		t.Fatalf("after the zombie's row: %v (%d differ)", st, rep.Differs)
	}
	if got := e.derivedCounts(); got != [3]uint64{161, 161, 161} {
		t.Fatalf("derived counts after the second repair: %v, want 160 each", got)
	}
	if err := CheckRebuilds(ctx, e.conn); err != nil {
		t.Fatal(err)
	}
}

// derivedView returns the (first) view of a derived table, as the
// migrations define it.
func derivedView(t *testing.T, table string) View {
	t.Helper()
	ds, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Name == table {
			return d.Views[0]
		}
	}
	t.Fatalf("no derived table %s", table)
	return View{}
}

// waitNoMembers waits until the sink's group is empty.
func waitNoMembers(t *testing.T, e *env) {
	t.Helper()
	members := GroupMembers(testenv.Admin(t, e.brokers), e.group)
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := members(context.Background())
		if err == nil && len(m) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s still has members %v (%v)", e.group, m, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRetentionDropsMonths drops the oldest month of the raw-event tables
// as docs/operations.md shows, and checks what verify then does: the
// month after the ledger's new oldest month is still compared and equal,
// the months before are skipped, and nothing is rebuilt (so an analyst
// month whose ledger rows are gone is never emptied).
func TestRetentionDropsMonths(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	data := SyntheticData{Events: 30_000, Revisions: 3_000, Customers: 50, Months: 4, Partitions: 4}
	for _, s := range data.Statements(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, tbl := range []string{"usage_events", "usage_duplicates", "usage_rejected", "events_by_customer", "usage_daily", "source_daily", "unbilled_events"} {
		if err := conn.Exec(ctx, "ALTER TABLE "+db+"."+tbl+" DROP PARTITION 202401"); err != nil {
			t.Fatal(err)
		}
	}
	cfg := VerifyConfig{Conn: conn, Database: db, Repair: true, Logger: zaptest.NewLogger(t),
		SinkMembers: func(context.Context) ([]string, error) { return nil, nil }}
	rep, err := Verify(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := statuses(rep)
	// The ledger's events now start in February (by Kafka timestamp):
	// March on is checked, February (its oldest month) is not, and
	// January of the analyst tables is gone as it should be.
	for k, want := range map[string]string{
		"events_by_customer/202402": MonthSkipped, "events_by_customer/202403": MonthEqual, "events_by_customer/202404": MonthEqual,
		"usage_daily/202403": MonthEqual, "source_daily/202403": MonthEqual, "unbilled_events/202403": MonthEqual,
		"invoice_lines/202402": MonthEqual, "aggregates_current/202402": MonthEqual,
	} {
		if st[k] != want {
			t.Errorf("%s: %q, want %q", k, st[k], want)
		}
	}
	// January's analyst rows are gone; a few ledger rows of January
	// events written in February remain: skipped, never rebuilt.
	if s, ok := st["events_by_customer/202401"]; ok && s != MonthSkipped {
		t.Errorf("events_by_customer/202401: %q, want skipped or absent", s)
	}
	if rep.Rebuilt != 0 || rep.Differs != 0 || rep.RunID != "" {
		t.Fatalf("retention made verify rebuild or report differences: %+v", st)
	}
	// The billing tables were not dropped: their months are all checked.
	var months []string
	for k, v := range st {
		if strings.HasPrefix(k, TableInvoiceLines+"/") && v == MonthEqual {
			months = append(months, k)
		}
	}
	if len(months) < 3 {
		t.Errorf("invoice_lines months compared: %v", months)
	}
}
