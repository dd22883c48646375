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

// INSERT attempts whose outcome is unknown (docs/design.md, The ClickHouse
// ledger, "Exactly once into ClickHouse").
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
// INSERT of rows of partitions that no list of this length names is taken
// to be of every partition ("*").
const maxIDPartitions = 200

// newInsertID is the query_id of an INSERT of rows of topic's partitions
// (the keys of spans):
//
//	meterline-sink/<database>/<topic>/<partitions>/<instance>/<process start>/<n>
//
// <partitions> is idPartitions of them. The instance, the process's start
// and a counter make it unique; the database, topic and partitions let
// another instance find, with a prefix match in system.processes, every
// INSERT still running of a partition it resumes (awaitInserts), and none
// of other partitions. Neither a database name (letters, digits,
// underscores: Config.Validate) nor a Kafka topic name can hold a '/'.
func (w *Writer) newInsertID(topic string, spans map[int32][2]int64) string {
	return fmt.Sprintf("%s%s/%s/%d/%d", insertIDPrefix(w.cfg.Database, topic), idPartitions(sortedKeys(spans)),
		w.cfg.InstanceID, processStart, insertIDs.Add(1))
}

// idPartitions names the partitions ps (sorted, distinct) in at most
// maxIDPartitions bytes: as a comma-separated list of partitions and runs
// of them ("0-31,40,42-50"), or, when that is longer, as a bitmap, "x" and
// hex digits, digit i holding partitions 4i to 4i+3, the lowest in its
// lowest bit ("x5" is 0 and 2), or, when neither fits, "*" (every
// partition). An instance writes all of its partitions in one INSERT: a
// list that named more than those (a "*") would hold every other
// instance's resume lookups while it writes, which is most of the time.
func idPartitions(ps []int32) string {
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(ps[i])))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(int(ps[j])))
		}
		i = j + 1
	}
	if b.Len() <= maxIDPartitions {
		return b.String()
	}
	if len(ps) > 0 && int(ps[len(ps)-1])/4+2 <= maxIDPartitions {
		digits := make([]byte, ps[len(ps)-1]/4+1)
		for _, p := range ps {
			digits[p/4] |= 1 << (p % 4)
		}
		for i, d := range digits {
			digits[i] = "0123456789abcdef"[d]
		}
		return "x" + string(digits)
	}
	return "*"
}

// insertIDPrefix is what the query_id of every INSERT of rows of topic into
// database begins with.
func insertIDPrefix(database, topic string) string {
	return queryIDPrefix + database + "/" + topic + "/"
}

// namesPartition reports whether the query_id id, which begins with prefix
// (insertIDPrefix), names one of the partitions of want (idPartitions).
// A list the sink cannot read is taken to name every partition: waiting
// too long is safe, not waiting is not.
func namesPartition(id, prefix string, want map[int32]bool) bool {
	list, _, _ := strings.Cut(strings.TrimPrefix(id, prefix), "/")
	if list == "*" {
		return true
	}
	if bits, ok := strings.CutPrefix(list, "x"); ok {
		for p := range want {
			if p < 0 || int(p/4) >= len(bits) {
				continue
			}
			d, err := strconv.ParseUint(bits[p/4:p/4+1], 16, 8)
			if err != nil || d&(1<<(p%4)) != 0 {
				return true
			}
		}
		for i := 0; i < len(bits); i++ {
			if _, err := strconv.ParseUint(bits[i:i+1], 16, 8); err != nil {
				return true
			}
		}
		return false
	}
	for _, s := range strings.Split(list, ",") {
		from, to, isRun := strings.Cut(s, "-")
		lo, err := strconv.ParseInt(from, 10, 32)
		hi := lo
		if err == nil && isRun {
			hi, err = strconv.ParseInt(to, 10, 32)
		}
		if err != nil {
			return true
		}
		for p := range want {
			if int64(p) >= lo && int64(p) <= hi {
				return true
			}
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

// processesDenied reports whether err is the server refusing the sink's
// user the read of system.processes (DATABASE_ACCESS_DENIED, ACCESS_DENIED):
// no retry makes it tell whether INSERTs still run (cannotTell). Any other
// answer (an overloaded server: too many queries, memory, a timeout; a
// refused login) says nothing of them: the wait goes on, or the lookup
// fails and is retried as while ClickHouse is unavailable.
func processesDenied(err error) bool {
	var ex *proto.Exception
	return errors.As(err, &ex) && (ex.Code == 291 || ex.Code == 497)
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
		if processesDenied(err) {
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
	if processesDenied(err) {
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
// run (a user that may not read system.processes, processesDenied): the
// resume lookup then runs without waiting for them, and the ledger's
// ReplacingMergeTree collapses a row they write after it (a backstop, as
// for a zombie).
func (w *Writer) cannotTell(err error, ids ...string) {
	w.log.Error("cannot read system.processes: not waiting for INSERT attempts whose outcome is unknown; a row they write after the resume lookup may be in the ledger twice until a merge",
		zap.Strings("query_ids", ids), zap.Error(err))
}

// INSERTs of another instance (docs/design.md, The ClickHouse ledger: a
// zombie sink's INSERT in flight).
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
		case processesDenied(err):
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
