package sink

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestZombieProgressAboveCommitted: a zombie sink (it lost partition 0 but
// does not know yet) ends a window: it inserts the rows at offsets 10..13,
// stops at the row ClickHouse refuses at 14 and records progress 15 (just
// past it), then its transaction is fenced: the refused row is not parked
// and the group's offset stays at 10. The new owner sees progress above
// the committed offset; that is no ErrOffsetsAhead (nor ErrOffsetsLost):
// it resumes at 10, skips the zombie's rows, parks the refused row once,
// and writes the rest. A forward reset past everything the database holds
// is still refused afterwards.
func TestZombieProgressAboveCommitted(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.exec("ALTER TABLE " + e.db + ".usage_events ADD COLUMN poison UInt8 MATERIALIZED throwIf(customer_id = 'poison')")
	var first, second []*kgo.Record
	for i := 0; i < 10; i++ {
		first = append(first, deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second)))
		second = append(second, deduped(topic, 0, 10+i, base.Add(time.Duration(10+i)*time.Second)))
	}
	var ev schemas.DedupedEvent
	if err := schemas.DecodeInto(second[4].Value, &ev); err != nil {
		t.Fatal(err)
	}
	ev.CustomerID = "poison"
	second[4].Value = schemas.MustEncode(&ev)
	e.produce(first...)
	e.runOnce(topic)
	e.produce(second...)

	zombie, _ := instanceOn(t, e.conn, e.db, "zombie", func(c *Config) { c.Topics = e.names; c.Group = e.group })
	zt := zombie.byTopic[topic]
	var zrows []*row
	for i, rec := range second[:4] {
		rec.Offset = int64(10 + i)
		r, err := zt.buildRow(rec)
		if err != nil {
			t.Fatal(err)
		}
		zrows = append(zrows, r)
	}
	ctx := ctxT(t, time.Minute)
	if err := zombie.insert(ctx, zt, zrows); err != nil {
		t.Fatalf("the zombie's INSERT: %v", err)
	}
	if err := zombie.recordProgress(ctx, map[tp]int64{{topic, 0}: 15}); err != nil {
		t.Fatalf("the zombie's progress: %v", err)
	}
	if c := e.committed(topic); c[0] != 10 {
		t.Fatalf("committed offset %d, want 10 (the zombie's commit fenced)", c[0])
	}
	e.exact(TableEvents, 14)

	r := e.start(nil)
	e.waitCaughtUp(time.Minute, topic, e.names.RejectedTopic())
	select {
	case <-r.exited:
		t.Fatalf("the new owner stopped: %v", r.err)
	default:
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, 19)
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != 14 {
		t.Fatalf("parked records %+v, want the row at offset 14 once", got)
	}
	e.exact(TableRejected, 1)
	if got := metric(t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomePresent); got != 4 {
		t.Errorf("rows skipped as already present = %v, want the zombie's 4", got)
	}

	// A forward reset past what the database holds is not hidden by the
	// zombie's progress.
	var third []*kgo.Record
	for i := 0; i < 10; i++ {
		third = append(third, deduped(topic, 0, 20+i, base.Add(time.Duration(20+i)*time.Second)))
	}
	e.produce(third...)
	e.setOffset(topic, 0, 25)
	expectRefusal(t, e.start(nil), topic+" partition 0", "committed offset 25", "below offset 20")
}
