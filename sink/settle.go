package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap"
)

// INSERT attempts whose outcome is unknown (DESIGN §7, "Exactly-once").
//
// An INSERT that fails without an answer from the server (the sink's
// deadline passed, the connection broke) may still be running there, and
// write its rows after the sink gave up on it. The resume rule is correct
// only if such an attempt has ended before it looks up which rows are in
// the table: otherwise the lookup misses rows that land just after it, and
// the retry writes them a second time (plain count() and the rollups then
// count them twice until a merge, or verify).
//
// Guarantee kept here: every INSERT carries a query_id of its own; an
// attempt with an unknown outcome is waited for, holding insertMu (so a
// revoke, and the next owner's lookup, wait for it too) until the server
// no longer lists it in system.processes, at most until settleDeadline; one
// that outlasts that wait is remembered, and no resume lookup runs until
// the server no longer lists it; nor does the next owner's, which finds it
// by its query_id (awaitInserts, below). (A user that may not read
// system.processes loses this wait: see cannotTell.)

// insertIDs numbers the INSERTs of this process.
var insertIDs atomic.Uint64

// processStart tells this process's query IDs from an earlier one's.
var processStart = time.Now().UnixNano()

// unsettled are the query IDs of INSERT attempts with an unknown outcome
// that the server may still run.
type unsettled struct {
	mu  sync.Mutex
	ids []string
}

// queryIDPrefix begins the query_id of every INSERT of the sink.
const queryIDPrefix = "meterline-sink/"

// maxIDPartitions caps the length of the partition list in a query_id: an
// INSERT of rows of more partitions names them all ("*").
const maxIDPartitions = 200

// newInsertID is the query_id of an INSERT of rows of topic's partitions
// (the keys of spans):
//
//	meterline-sink/<database>/<topic>/<partitions>/<instance>/<process start>/<n>
//
// <partitions> is a comma-separated list, or "*" for every partition of the
// topic when the list would be long. The instance, the process's start and
// a counter make it unique; the database, topic and partitions let another
// instance find, with a prefix match in system.processes, every INSERT
// still running of a partition it resumes (awaitInserts). Neither a
// database name nor a Kafka topic name can hold a '/'.
func (w *Writer) newInsertID(topic string, spans map[int32][2]int64) string {
	ps := sortedKeys(spans)
	list := make([]string, len(ps))
	for i, p := range ps {
		list[i] = strconv.Itoa(int(p))
	}
	parts := strings.Join(list, ",")
	if len(parts) > maxIDPartitions {
		parts = "*"
	}
	return fmt.Sprintf("%s%s/%s/%d/%d", insertIDPrefix(w.cfg.Database, topic), parts, w.cfg.InstanceID, processStart, insertIDs.Add(1))
}

// insertIDPrefix is what the query_id of every INSERT of rows of topic into
// database begins with.
func insertIDPrefix(database, topic string) string {
	return queryIDPrefix + database + "/" + topic + "/"
}

// namesPartition reports whether the query_id id, which begins with prefix
// (insertIDPrefix), names one of the partitions of want.
func namesPartition(id, prefix string, want map[int32]bool) bool {
	list, _, _ := strings.Cut(strings.TrimPrefix(id, prefix), "/")
	if list == "*" {
		return true
	}
	for _, s := range strings.Split(list, ",") {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil || want[int32(p)] {
			// A list the sink cannot read is taken to name every
			// partition: waiting too long is safe, not waiting is not.
			return true
		}
	}
	return false
}

// answered reports whether err is the server's answer to the query (an
// exception): the query has ended there.
func answered(err error) bool {
	var ex *proto.Exception
	return errors.As(err, &ex)
}

// settleDeadline bounds how long a failed INSERT, begun at start, waits
// for its attempt to end on the server, while holding insertMu: a revoke
// waits for it, and must end within the rebalance timeout with room to
// rejoin the group. The wait lasts at most InsertTimeout, and the attempt
// and its wait together end a tenth of RebalanceTimeout before it.
func (w *Writer) settleDeadline(start time.Time) time.Time {
	r := w.cfg.RebalanceTimeout
	d := time.Now().Add(w.cfg.InsertTimeout)
	if end := start.Add(r - r/10); end.Before(d) {
		return end
	}
	return d
}

// settleInsert waits until the server no longer runs the INSERT id, begun
// at start, whose outcome is unknown, until settleDeadline (no query runs
// past it); if it may still run then, it is remembered for awaitSettled.
func (w *Writer) settleInsert(ctx context.Context, id string, start time.Time) {
	deadline := w.settleDeadline(start)
	var err error
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			w.log.Warn("an INSERT whose outcome is unknown may still run on the server: no resume lookup until it has ended",
				zap.String("query_id", id), zap.Error(err))
			w.unsettled.mu.Lock()
			w.unsettled.ids = append(w.unsettled.ids, id)
			w.unsettled.mu.Unlock()
			return
		}
		var running []string
		running, err = w.stillRunning(ctx, []string{id}, min(w.cfg.QueryTimeout, left))
		if err == nil && len(running) == 0 {
			return
		}
		if answered(err) {
			w.cannotTell(err, id)
			return
		}
		_ = sleep(ctx, min(50*time.Millisecond, max(time.Until(deadline), 0)))
	}
}

// awaitSettled returns nil once no INSERT attempt with an unknown outcome
// may still run on the server, and an error (the lookup is then retried
// after a back-off, as when ClickHouse is unavailable) while one does.
func (w *Writer) awaitSettled(ctx context.Context) error {
	w.unsettled.mu.Lock()
	defer w.unsettled.mu.Unlock()
	if len(w.unsettled.ids) == 0 {
		return nil
	}
	running, err := w.stillRunning(ctx, w.unsettled.ids, w.cfg.QueryTimeout)
	if answered(err) {
		w.cannotTell(err, w.unsettled.ids...)
		w.unsettled.ids = nil
		return nil
	}
	if err != nil {
		return fmt.Errorf("sink: is an earlier INSERT still running: %w", err)
	}
	w.unsettled.ids = running
	if len(running) > 0 {
		return fmt.Errorf("sink: an earlier INSERT whose outcome is unknown still runs on the server (query_id %s): the resume lookup waits for it", running[0])
	}
	return nil
}

// stillRunning returns those of ids that the server still runs, asking
// it for at most timeout.
func (w *Writer) stillRunning(ctx context.Context, ids []string, timeout time.Duration) ([]string, error) {
	qs := make([]string, len(ids))
	for i, id := range ids {
		qs[i] = quote(id)
	}
	return w.runningIDs(ctx, "query_id IN ("+strings.Join(qs, ", ")+")", nil, timeout)
}

// runningIDs returns the query_ids of the queries the server runs that
// match the condition where and keep (every one when keep is nil), asking
// it for at most timeout.
func (w *Writer) runningIDs(ctx context.Context, where string, keep func(string) bool, timeout time.Duration) ([]string, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rows, err := w.getConn().Query(qctx, processesQuery(where))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if keep == nil || keep(id) {
			out = append(out, id)
		}
	}
	return out, rows.Err()
}

// processesQuery lists the query_ids of the queries the server runs that
// match the condition where.
func processesQuery(where string) string {
	return "SELECT query_id FROM system.processes WHERE " + where
}

// cannotTell logs that the server refused to say whether INSERTs still
// run (a user that may not read system.processes): the resume lookup then
// runs without waiting for them, and the ledger's ReplacingMergeTree
// collapses a row they write after it (a backstop, as for a zombie).
func (w *Writer) cannotTell(err error, ids ...string) {
	w.log.Error("cannot read system.processes: not waiting for INSERT attempts whose outcome is unknown; a row they write after the resume lookup may be in the ledger twice until a merge",
		zap.Strings("query_ids", ids), zap.Error(err))
}

// INSERTs of another instance (DESIGN §7: a zombie sink's INSERT in
// flight).
//
// An instance that lost its partitions (a rebalance, or a network pause or
// GC stall past the session timeout, after which the group gave them to
// another) may still have an INSERT of their rows running on the server.
// Its rows land whenever it ends: after the new owner's resume lookup,
// the new owner writes them a second time.
//
// Guarantee kept here: before the first resume lookup of a partition in a
// dirty spell (after every assignment), the sink waits until the server
// runs no INSERT whose query_id names that topic-partition, whichever
// instance sent it, for at most settleDeadline; if one still runs then,
// the lookup fails (it is retried after a back-off, fetching paused and
// /readyz saying why, as while ClickHouse is unavailable) and nothing of
// the partition is written until none runs.
//
// Not covered: system.processes lists the queries of the one server asked.
// The sink writes one server (its address; the ledger tables are not
// replicated), so every instance of a group sends its INSERTs there: an
// address that spreads connections over several servers breaks this wait
// as it breaks the resume rule. And an instance that has not learned yet
// that it lost a partition (it wakes from a pause, and its next heartbeat
// has not told it) can start an INSERT after the new owner's wait; the
// ledger's ReplacingMergeTree collapses those rows at a merge, and
// `meterline verify` repairs the rollups that counted them.

// errInsertRunning is wrapped by the error of a resume lookup that waited
// in vain for an INSERT of its partitions to end on the server.
var errInsertRunning = errors.New("resume lookup waits")

// awaitInserts returns nil once the server runs no INSERT of rows of
// topic's partitions parts (into table t, or any table of the topic), and
// an error when one still runs at settleDeadline, or the server cannot be
// asked.
func (w *Writer) awaitInserts(ctx context.Context, t *table, parts []int32) error {
	want := make(map[int32]bool, len(parts))
	for _, p := range parts {
		want[p] = true
	}
	prefix := insertIDPrefix(w.cfg.Database, t.topic)
	start := time.Now()
	deadline := w.settleDeadline(start)
	var first []string
	for {
		if w.revoked.Load() {
			return errAbandon
		}
		running, err := w.runningIDs(ctx, idHasPrefix(prefix), func(id string) bool { return namesPartition(id, prefix, want) },
			min(w.cfg.QueryTimeout, max(time.Until(deadline), 100*time.Millisecond)))
		switch {
		case answered(err):
			w.log.Error("cannot read system.processes: not waiting for INSERTs of other instances before the resume lookup; rows one writes after it may be in the ledger twice until a merge",
				zap.String("topic", t.topic), zap.Any("partitions", parts), zap.Error(err))
			return nil
		case err != nil:
			return fmt.Errorf("sink: are INSERTs of %s partitions %v still running: %w", t.topic, parts, err)
		case len(running) == 0:
			if first != nil {
				w.m.insertWaits.WithLabelValues(t.name, waitEnded).Inc()
				w.log.Info("INSERTs of the partitions ended on the server; resuming", zap.String("topic", t.topic),
					zap.Strings("query_ids", first), zap.Duration("waited", time.Since(start)))
			}
			return nil
		}
		if first == nil {
			first = running
			w.log.Info("INSERTs of partitions this instance resumes still run on the server (sent by an instance that lost them?): the resume lookup waits for them",
				zap.String("topic", t.topic), zap.Any("partitions", parts), zap.Strings("query_ids", running))
		}
		if !time.Now().Before(deadline) {
			w.m.insertWaits.WithLabelValues(t.name, waitStillRunning).Inc()
			err := fmt.Errorf("sink: %w: an INSERT of %s partitions %v still runs on the server after %s (query_id %s; %d in all): the resume lookup waits for it, writing nothing of these partitions; if it hangs, KILL QUERY WHERE query_id = %s ends it",
				errInsertRunning, t.topic, parts, time.Since(start).Round(time.Millisecond), running[0], len(running), quote(running[0]))
			w.log.Warn("an INSERT of partitions this instance resumes still runs on the server: backing off, then waiting again", zap.Error(err))
			return err
		}
		if err := sleep(ctx, min(50*time.Millisecond, time.Until(deadline))); err != nil {
			return errAbandon
		}
	}
}

// idHasPrefix is the condition that query_id begins with prefix.
func idHasPrefix(prefix string) string {
	return "startsWith(query_id, " + quote(prefix) + ")"
}
