package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestErrorClasses pins the classification of INSERT errors: the names of
// the codes in both lists are ClickHouse's, no code is in both, and a code
// in neither is unknown (never a refusal: only rows the server refused are
// parked; docs/design.md, The ClickHouse ledger, "Refused blocks").
func TestErrorClasses(t *testing.T) {
	for name, codes := range map[string]map[int32]string{"transient": transientCodes, "refusal": refusalCodes} {
		for code, want := range codes {
			if got := chproto.Error(code).String(); got != want {
				t.Errorf("%s code %d is named %s here, %s by ClickHouse", name, code, want, got)
			}
		}
	}
	for code := range refusalCodes {
		if _, ok := transientCodes[code]; ok {
			t.Errorf("code %d is both transient and a refusal", code)
		}
	}
	for _, c := range []struct {
		err  error
		want errClass
	}{
		{&proto.Exception{Code: 395}, classRefused},     // throwIf in a MATERIALIZED column
		{&proto.Exception{Code: 6}, classRefused},       // CANNOT_PARSE_TEXT
		{&proto.Exception{Code: 241}, classUnavailable}, // MEMORY_LIMIT_EXCEEDED
		{&proto.Exception{Code: 36}, classUnknown},      // BAD_ARGUMENTS: e.g. a dictionary that is not there
		{&proto.Exception{Code: 160}, classUnknown},     // TOO_SLOW
		{&proto.Exception{Code: 99999}, classUnknown},   // a code from a newer server
		{fmt.Errorf("send: %w", &proto.Exception{Code: 36}), classUnknown},
		{&driverError{column: "source", err: errors.New("too long")}, classRefused},
		{&prepareError{&proto.Exception{Code: 395}}, classUnavailable}, // nothing sent: never a refusal
		{&prepareError{&proto.Exception{Code: 36}}, classUnknown},      // nor an unavailable server
		{errors.New("connection reset"), classUnavailable},
	} {
		if got := classify(c.err); got != c.want {
			t.Errorf("classify(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// failEveryInsert makes every INSERT into usage_events fail with a real
// server error the sink does not know: code 160 (TOO_SLOW, "The maximum
// sleep time is 3000000 microseconds"), raised by a MATERIALIZED column
// whose expression fails on every block alike. Nothing is wrong with the
// rows.
func (e *env) failEveryInsert() {
	e.exec("ALTER TABLE " + e.db + ".usage_events ADD COLUMN slow UInt8 MATERIALIZED sleep(4)")
	if _, known := refusalCodes[160]; known {
		e.t.Fatal("code 160 is a known refusal code; this test needs an unknown one")
	}
	if _, known := transientCodes[160]; known {
		e.t.Fatal("code 160 is a known transient code; this test needs an unknown one")
	}
}

// nothingParkedOrCommitted checks that the sink parked no row of
// usage.deduped, committed none of its offsets and wrote no row.
func (e *env) nothingParkedOrCommitted() {
	e.t.Helper()
	if got := e.parkedRecords(); len(got) != 0 {
		e.t.Fatalf("%d rows parked on an unknown error code; want none", len(got))
	}
	if c := e.committed(e.names.DedupedTopic()); len(c) != 0 {
		e.t.Fatalf("offsets committed while INSERTs fail: %v", c)
	}
	if n := e.count(TableEvents); n != 0 {
		e.t.Fatalf("%d rows in the table", n)
	}
}

// TestUnknownErrorBacksOff: an INSERT failing with an error code the sink
// does not know is treated like an unavailable server, not as a refusal:
// no row is parked, no offset committed, /readyz is down; once the server
// is fixed, every row is written.
func TestUnknownErrorBacksOff(t *testing.T) {
	e := newEnv(t, 2)
	e.failEveryInsert()
	recs, rows := e.events(100, base)
	e.produce(recs...)
	r := e.start(func(c *Config) { c.UnknownErrorLimit = 10 * time.Minute })
	deadline := time.Now().Add(time.Minute)
	for metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableEvents) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("no three failed INSERTs within a minute; Ready() = %v", r.w.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // a refusal would be parked and committed by now
	err := r.w.Ready()
	if err == nil || !strings.Contains(err.Error(), "cannot take rows of usage_events") || !strings.Contains(err.Error(), "code: 160") {
		t.Errorf("Ready() = %v; want the blocked table and the code", err)
	}
	e.nothingParkedOrCommitted()
	if got := metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableEvents, "kind", "refused"); got != 0 {
		t.Errorf("%v INSERTs counted as refused", got)
	}
	if got := metric(t, r.reg, "meterline_sink_insert_errors_total", "table", TableEvents, "kind", "unknown"); got < 3 {
		t.Errorf("%v INSERTs counted as unknown, want every failure", got)
	}

	e.exec("ALTER TABLE " + e.db + ".usage_events DROP COLUMN slow")
	e.waitCaughtUp(2*time.Minute, e.names.DedupedTopic())
	if err := r.w.Ready(); err != nil {
		t.Errorf("not ready after the server was fixed: %v", err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, uint64(rows))
	if got := e.parkedRecords(); len(got) != 0 {
		t.Fatalf("%d rows parked; want none", len(got))
	}
}

// TestUnknownErrorStops: past UnknownErrorLimit the sink stops with
// ErrUnknownServerError naming the table and the code, rather than park
// rows that may be fine; nothing was parked or committed, and /readyz
// shows the error.
func TestUnknownErrorStops(t *testing.T) {
	e := newEnv(t, 2)
	e.failEveryInsert()
	recs, _ := e.events(50, base)
	e.produce(recs...)
	r := e.start(func(c *Config) { c.UnknownErrorLimit = 3 * time.Second })
	select {
	case <-r.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the sink did not stop within 2 minutes; Ready() = %v", r.w.Ready())
	}
	if !errors.Is(r.err, ErrUnknownServerError) || !strings.Contains(r.err.Error(), "usage_events") ||
		!strings.Contains(r.err.Error(), "code 160 (TOO_SLOW)") {
		t.Fatalf("Run = %v; want ErrUnknownServerError naming usage_events and code 160", r.err)
	}
	t.Logf("Run stopped: %v", r.err)
	if err := r.w.Ready(); !errors.Is(err, ErrUnknownServerError) {
		t.Errorf("Ready() = %v; want the fatal error", err)
	}
	e.nothingParkedOrCommitted()
}

// unknownOnce is a ClickHouse connection that fails resume lookups of the
// ledger and lookups of parked rows while lookups > 0, and the next insertFails INSERTs, each with a
// server error code the sink does not know (36, BAD_ARGUMENTS), and
// otherwise passes every call on.
type unknownOnce struct {
	driver.Conn
	lookups, insertFails atomic.Int32
}

func (c *unknownOnce) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	if (strings.HasPrefix(q, "SELECT kafka_partition, ") || strings.HasPrefix(q, "SELECT source_offset ")) && c.lookups.Add(-1) >= 0 {
		return nil, &proto.Exception{Code: 36, Name: "DB::Exception", Message: "lookup failing"}
	}
	return c.Conn.Query(ctx, q, args...)
}

func (c *unknownOnce) PrepareBatch(ctx context.Context, q string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	b, err := c.Conn.PrepareBatch(ctx, q, opts...)
	if err == nil && c.insertFails.Add(-1) >= 0 {
		return failingSend{b}, nil
	}
	return b, err
}

// failingSend is an INSERT the server answers with an error code the sink
// does not know, having written nothing.
type failingSend struct{ driver.Batch }

func (b failingSend) Send() error {
	_ = b.Batch.Abort()
	return &proto.Exception{Code: 36, Name: "DB::Exception", Message: "insert failing"}
}

// TestUnknownSpellEndsWithTheRowsPresent: resume lookups failed with an
// error code the sink does not know, then answered that every row was in
// the table already; nothing was inserted. That spell is over: an INSERT
// failing with such a code long after is a spell of its own, given
// UnknownErrorLimit, not charged with the time since the first one (the
// sink used to stop at once).
func TestUnknownSpellEndsWithTheRowsPresent(t *testing.T) {
	w, conn, _, ctx := offlineWriter(t, "i1")
	uc := &unknownOnce{Conn: conn}
	w.conn = uc
	w.paused.Store(true) // no Kafka session whose fetching a back-off would pause
	w.cfg.UnknownErrorLimit, w.cfg.BackoffMin, w.cfg.BackoffMax = 2*time.Second, 20*time.Millisecond, 50*time.Millisecond
	tbl := w.byTopic[w.cfg.Topics.DedupedTopic()]
	w.parts[tp{tbl.topic, 0}] = &pstate{committed: 0, checked: true}
	var rows []*row
	for i := 0; i < 10; i++ {
		r, err := tbl.buildRow(&kgo.Record{Topic: tbl.topic, Offset: int64(i), Value: deduped(tbl.topic, 0, i, base).Value, Timestamp: base})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	if err := w.insert(ctx, tbl, rows[:5]); err != nil {
		t.Fatal(err)
	}
	// Read again (the partition dirty): the lookups fail twice, then find
	// every row there.
	w.markRowsDirty(tbl, rows[:5])
	uc.lookups.Store(2)
	if _, err := w.writeTable(ctx, tbl, rows[:5], nil); err != nil {
		t.Fatalf("rows present: writeTable = %v", err)
	}
	time.Sleep(w.cfg.UnknownErrorLimit + 500*time.Millisecond)
	// Later, one INSERT fails with such a code, and the retry succeeds.
	uc.insertFails.Store(1)
	if _, err := w.writeTable(ctx, tbl, rows[5:], nil); err != nil {
		t.Fatalf("one INSERT failing with an unknown code, long after the lookups' spell: writeTable = %v", err)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+w.cfg.Database+".usage_events").Scan(&n); err != nil || n != 10 {
		t.Fatalf("rows = %d (%v), want 10", n, err)
	}
}

// lookupsFailing is an offlineWriter whose lookups (unknownOnce) all fail
// with an error code it does not know, with an UnknownErrorLimit of 1 s.
func lookupsFailing(t *testing.T) (*Writer, context.Context) {
	w, conn, _, ctx := offlineWriter(t, "i1")
	uc := &unknownOnce{Conn: conn}
	uc.lookups.Store(1 << 30)
	w.conn = uc
	w.paused.Store(true) // no Kafka session whose fetching a back-off would pause
	w.cfg.UnknownErrorLimit, w.cfg.BackoffMin, w.cfg.BackoffMax = time.Second, 20*time.Millisecond, 50*time.Millisecond
	return w, ctx
}

// TestUnknownQuarantineLookupStops: the lookup before a write to
// usage_quarantine failing with an error code the sink does not know is
// bounded by UnknownErrorLimit as the resume lookup of any other table is
// (it used to back off for ever).
func TestUnknownQuarantineLookupStops(t *testing.T) {
	w, ctx := lookupsFailing(t)
	rec := &kgo.Record{Topic: w.cfg.Topics.RejectedTopic(), Offset: 3, Value: []byte("garbage"), Timestamp: base}
	w.parts[tp{rec.Topic, 0}] = &pstate{committed: 0, checked: true}
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := w.writeQuarantine(qctx, []*row{quarantineRow(rec, schemas.ReasonUndecodable, "test")})
	if !errors.Is(err, ErrUnknownServerError) {
		t.Fatalf("writeQuarantine = %v; want ErrUnknownServerError after %s", err, w.cfg.UnknownErrorLimit)
	}
}

// TestUnknownParkedLookupStops: the lookup of the rows parked below a
// partition's recorded progress (a re-read, reread.go) failing with an
// error code the sink does not know is bounded by UnknownErrorLimit as the
// resume lookup is (it used to back off for ever).
func TestUnknownParkedLookupStops(t *testing.T) {
	w, ctx := lookupsFailing(t)
	k := tp{w.cfg.Topics.DedupedTopic(), 0}
	w.parts[k] = &pstate{committed: 0, checked: true, reread: rereadState{progress: 10}}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := w.parkedBefore(pctx, k, 3); !errors.Is(err, ErrUnknownServerError) {
		t.Fatalf("parkedBefore = %v; want ErrUnknownServerError after %s", err, w.cfg.UnknownErrorLimit)
	}
}

// progressUnknown is a ClickHouse connection whose reads of sink_progress
// fail with an error code the sink does not know (36, BAD_ARGUMENTS).
type progressUnknown struct{ driver.Conn }

func (c progressUnknown) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	if strings.HasPrefix(q, "SELECT consumer_group, ") {
		return nil, &proto.Exception{Code: 36, Name: "DB::Exception", Message: "progress failing"}
	}
	return c.Conn.Query(ctx, q, args...)
}

// TestUnknownProgressCheckStops: the check of newly assigned partitions
// against the recorded progress failing with an error code the sink does
// not know stops the sink after UnknownErrorLimit, as a lookup or an
// INSERT failing so does (it used to retry for ever, not ready).
func TestUnknownProgressCheckStops(t *testing.T) {
	e := newEnv(t, 1)
	e.produce(deduped(e.names.DedupedTopic(), 0, 0, base))
	r := e.start(func(c *Config) { c.Conn = progressUnknown{e.conn}; c.UnknownErrorLimit = 2 * time.Second })
	select {
	case <-r.exited:
	case <-time.After(time.Minute):
		t.Fatalf("the sink did not stop within a minute; Ready() = %v", r.w.Ready())
	}
	if !errors.Is(r.err, ErrUnknownServerError) || !strings.Contains(r.err.Error(), ProgressTable) {
		t.Fatalf("Run = %v; want ErrUnknownServerError naming %s", r.err, ProgressTable)
	}
}

// zoneLoginRefused is a ClickHouse connection that refuses the login (code
// 516, AUTHENTICATION_FAILED) of the time zone check, as a server back from
// a restart with the sink's password changed does on a new connection.
type zoneLoginRefused struct{ driver.Conn }

func (c zoneLoginRefused) QueryRow(ctx context.Context, q string, args ...any) driver.Row {
	if q == serverTimezoneKnownSQL {
		return errRow{&proto.Exception{Code: 516, Name: "DB::Exception", Message: "default: Authentication failed"}}
	}
	return c.Conn.QueryRow(ctx, q, args...)
}

type errRow struct{ err error }

func (r errRow) Err() error           { return r.err }
func (r errRow) Scan(...any) error    { return r.err }
func (r errRow) ScanStruct(any) error { return r.err }

// TestZoneCheckLoginRefusedStops: ClickHouse came back from an outage
// refusing the sink's login; the time zone check before the next INSERT
// meets the refusal first, and stops the sink as a refused INSERT does
// (it used to back off for ever).
func TestZoneCheckLoginRefusedStops(t *testing.T) {
	w, conn, _, ctx := offlineWriter(t, "i1")
	w.conn = zoneLoginRefused{conn}
	w.paused.Store(true) // no Kafka session whose fetching a back-off would pause
	w.cfg.BackoffMin, w.cfg.BackoffMax = 20*time.Millisecond, 50*time.Millisecond
	w.zoneUnchecked.Store(true) // ClickHouse went away
	tbl := w.byTopic[w.cfg.Topics.DedupedTopic()]
	w.parts[tp{tbl.topic, 0}] = &pstate{committed: 0, checked: true}
	r, err := tbl.buildRow(&kgo.Record{Topic: tbl.topic, Value: deduped(tbl.topic, 0, 0, base).Value, Timestamp: base})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := w.writeTable(wctx, tbl, []*row{r}, nil); !errors.Is(err, ErrAuthentication) {
		t.Fatalf("writeTable = %v; want ErrAuthentication", err)
	}
}
