package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
)

// sinkArgs are the command-line flags for the env's sink.
func (e *env) sinkArgs(extra ...string) []string {
	args := []string{"sink", "--brokers", strings.Join(e.brokers, ","), "--clickhouse", e.addr,
		"--database", e.db, "--topic-prefix", e.names.Prefix, "--group", e.group, "--instance-id", "crash-1",
		"--metrics-addr", "127.0.0.1:0", "--session-timeout", "6s", "--max-batch-wait", "200ms", "--commit-interval", "300ms"}
	return append(args, extra...)
}

// spawn starts the real binary as a child of the test (crash.Children:
// killed when the test ends, its log kept if the test failed); faultSpec
// arms a fault point ("" none).
func (e *env) spawn(faultSpec string, args ...string) *testenv.Process {
	e.t.Helper()
	if e.children == nil {
		e.children = crash.NewChildren(e.t, "meterline-sink-logs")
	}
	return e.children.Start("sink", crash.StartOpts{Fault: faultSpec}, args...)
}

// committed returns the group's committed offsets of topic.
func (e *env) committed(topic string) map[int32]int64 {
	e.t.Helper()
	out, err := testenv.Committed(ctxT(e.t, 30*time.Second), e.brokers, e.group, topic)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// beyondCommitted counts the table's rows at or past the committed offsets.
func (e *env) beyondCommitted(table, topic string) uint64 {
	e.t.Helper()
	c := e.committed(topic)
	var conds []string
	for p := int32(0); p < e.parts; p++ {
		conds = append(conds, fmt.Sprintf("(kafka_partition = %d AND kafka_offset >= %d)", p, c[p]))
	}
	return e.count(table, "("+strings.Join(conds, " OR ")+")")
}

// fingerprint is an order-independent hash of every column of every row.
func (e *env) fingerprint(db, table string) (n, sum uint64) {
	e.t.Helper()
	var cols []string
	for _, tb := range newTables(e.names) {
		if tb.name == table {
			for _, c := range tb.columns {
				cols = append(cols, "cityHash64("+c.name+")")
			}
		}
	}
	q := "SELECT count(), sum(cityHash64(" + strings.Join(cols, ", ") + ")) FROM " + db + "." + table
	if err := e.conn.QueryRow(ctxT(e.t, time.Minute), q).Scan(&n, &sum); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n, sum
}

// reference writes the same topics with an uninterrupted in-process sink
// into a second database under a second group, and returns its
// fingerprint of table: what the crashed run must equal.
func (e *env) reference(table string, wantRows uint64) (n, sum uint64) {
	e.t.Helper()
	conn, db := testenv.ClickHouseDB(e.t)
	if _, err := Migrate(ctxT(e.t, time.Minute), conn); err != nil {
		e.t.Fatal(err)
	}
	ref := *e
	ref.db, ref.conn, ref.group = db, conn, testenv.Name(e.t, "sink-reference")
	r := ref.start(nil)
	ref.waitCaughtUp(2 * time.Minute)
	if err := r.stop(); err != nil {
		e.t.Fatal(err)
	}
	ref.exact(table, wantRows)
	return e.fingerprint(db, table)
}

func (e *env) checkAgainstReference(table string, want uint64) {
	e.t.Helper()
	e.exact(table, want)
	e.verifyAgrees()
	n, sum := e.fingerprint(e.db, table)
	rn, rsum := e.reference(table, want)
	if n != rn || sum != rsum {
		e.t.Fatalf("%s after the crash differs from an uninterrupted run: %d rows hash %x, reference %d rows hash %x", table, n, sum, rn, rsum)
	}
}

// TestCrashAfterInsert kills the real binary between a window's INSERTs
// and its offset commit, then restarts it: rows of the killed window are in
// the table past the committed offsets, the restart skips them (resume
// rule), and plain count() is exact; every row equals an uninterrupted
// run's.
func TestCrashAfterInsert(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 4)
	args := e.sinkArgs("--max-batch-records", "500")
	// Phase 1, committed by a clean run.
	first, n1 := e.events(500, base)
	e.produce(first...)
	p := e.spawn("", args...)
	e.waitCaughtUp(2*time.Minute, e.names.DedupedTopic())
	p.Stop(t)
	// Phase 2: killed after the INSERTs of its first window.
	var second []*kgo.Record
	n2 := 0
	for p := int32(0); p < e.parts; p++ {
		for i := 500; i < 1500; i++ {
			second = append(second, deduped(e.names.DedupedTopic(), p, i, base.Add(time.Duration(i)*time.Second)))
			n2++
		}
	}
	e.produce(second...)
	p = e.spawn(FaultAfterInsert, args...)
	p.ExpectFaultKill(t, FaultAfterInsert, 2*time.Minute)
	beyond := e.beyondCommitted(TableEvents, e.names.DedupedTopic())
	total := e.count(TableEvents)
	t.Logf("killed after a window's INSERTs: %d rows in the table, %d of them past the committed offsets", total, beyond)
	if beyond == 0 || total-beyond != uint64(n1) {
		t.Fatalf("%d rows past the committed offsets, %d before: want phase 2 rows past, the %d phase 1 rows before", beyond, total-beyond, n1)
	}

	p = e.spawn("", args...)
	e.waitCaughtUp(2*time.Minute, e.names.DedupedTopic())
	p.Stop(t)
	if !strings.Contains(p.LogText(), "resume rule: rows already in the table skipped") {
		t.Errorf("the restart logged no skipped rows")
	}
	e.checkAgainstReference(TableEvents, uint64(n1+n2))
}

// TestCrashMidInsert kills the real binary during an INSERT sent as several
// blocks, each spanning two months (two parts per block): some parts of
// the INSERT are written, the rest not. The restart inserts exactly the
// missing rows.
func TestCrashMidInsert(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 4)
	// Timestamps alternate between January 31st and February 1st (Kafka
	// timestamps need not grow with the offset): every block holds rows of
	// both months, so the server writes two parts per block.
	recs, n := e.events(1000, base)
	for i, r := range recs {
		if i%2 == 1 {
			r.Timestamp = r.Timestamp.Add(2 * time.Hour)
		}
	}
	e.produce(recs...)
	args := e.sinkArgs("--max-batch-records", "2000", "--insert-block-rows", "150")
	// What the server wrote of an INSERT whose client died depends on how
	// far it had read the connection; kill again (each restart going
	// through the resume rule) until a kill left part of an INSERT behind.
	partial := false
	for round, hit := range []int{7, 3, 5, 2} {
		p := e.spawn(fmt.Sprintf("%s@%d", FaultMidInsert, hit), args...)
		p.ExpectFaultKill(t, FaultMidInsert, 2*time.Minute)
		beyond := e.beyondCommitted(TableEvents, e.names.DedupedTopic())
		total := e.count(TableEvents)
		var parts uint64
		if err := e.conn.QueryRow(ctxT(t, time.Minute), "SELECT count() FROM system.parts WHERE database = '"+e.db+"' AND table = 'usage_events' AND active").Scan(&parts); err != nil {
			t.Fatal(err)
		}
		t.Logf("kill %d, mid-INSERT after block %d: %d rows in the table, %d of them past the committed offsets; %d active parts", round+1, hit, total, beyond, parts)
		if beyond > 0 && total < uint64(n) {
			partial = true
			break
		}
	}
	if !partial {
		t.Fatal("no kill left part of an INSERT in the table")
	}
	p := e.spawn("", args...)
	e.waitCaughtUp(2*time.Minute, e.names.DedupedTopic())
	p.Stop(t)
	e.checkAgainstReference(TableEvents, uint64(n))
	var months uint64
	if err := e.conn.QueryRow(ctxT(t, time.Minute), "SELECT uniqExact(toYYYYMM(kafka_timestamp)) FROM "+e.db+".usage_events").Scan(&months); err != nil || months != 2 {
		t.Fatalf("rows span %d months (%v), want 2", months, err)
	}
}

// verifyAgrees runs meterline verify's comparison (no repair) on the env's
// database and fails the test unless every derived table agrees with the
// ledger and no aggregate key has two FINAL revisions.
func (e *env) verifyAgrees() {
	e.t.Helper()
	rep, err := Verify(ctxT(e.t, 2*time.Minute), VerifyConfig{Conn: e.conn, Database: e.db})
	if err != nil {
		e.t.Fatalf("verify: %v", err)
	}
	if rep.Differs != 0 || rep.DoubleFinalKeys != 0 {
		e.t.Fatalf("verify disagrees after the crash: %d months differ, %d keys with two FINALs: %+v", rep.Differs, rep.DoubleFinalKeys, rep.Months)
	}
}
