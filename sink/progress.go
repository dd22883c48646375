package sink

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
)

// Progress: the sink's own record, in ClickHouse, of how far its tables
// reflect each partition (table sink_progress, migration 008), and the
// check of the group's committed offsets against it on assignment
// (docs/design.md, The ClickHouse ledger, "Offsets ahead of the tables":
// offsets are never reset silently).
//
// Guarantees kept here: a window's progress row is written after its rows
// are in their tables and before its offsets are committed, with exactly
// the offsets the transaction commits (a stopped partition's: just past
// its parked row), so the recorded progress of a partition is never below
// an offset the sink committed. A committed offset above the recorded
// progress was therefore moved by someone else (an operator's reset, or a
// new database behind the same group): the records in between may be in
// no table, and the sink stops before it consumes anything of that
// partition, naming the partition, both offsets, the command that
// repairs it and `meterline sink accept-offsets`, which records the
// committed offset as progress on purpose (AcceptOffsets, accept.go).
// A committed offset below the recorded progress is read again from
// there, parking only the rows refused there that no committed park
// covers (reread.go).
//
// The progress a committed offset is compared with is the highest any
// group recorded for the partition: records below it are in the tables,
// whoever wrote them. A zombie's progress row (written before its commit
// was fenced) raises it above the committed offset, the normal case
// above. A partition for which the group has neither a committed offset
// nor progress, but another group recorded progress, is a new group name
// on an existing database: read from its start, the rows refused below
// that progress would be parked a second time, and two groups writing
// one database write every new row twice; the sink stops
// (ErrOtherGroup), unless the partition's log starts at or past that
// progress.
//
// A partition with recorded progress and no committed offset at all is
// either a crash before the partition's first commit (the progress of a
// window cut before its commit) or the group's offsets lost (expired
// after offsets.retention.minutes, or the group deleted). Each progress
// row says which: from_committed (migration 010) is 0 when its window
// started with no committed offset of the group, 1 otherwise, and the
// row of the highest next_offset decides (1 on a tie). 0: the partition
// is read from its start, as on a first start; the resume lookup skips
// the rows already in the tables and reread.go parks no refused row
// twice. 1: the offsets were lost, and the sink stops before it consumes
// anything of the partition (ErrOffsetsLost; docs/design.md, The ClickHouse
// ledger, "Offsets ahead of the tables": never reset silently), naming it,
// its progress, its log start and the repairs: a reset to the earliest
// offset, or to an offset at or below the progress (both safe: reread.go
// parks nothing twice). Not a reset to exactly the progress as a rule: a
// window cut between its progress row and its commit leaves the progress
// past the offset really committed, and a row refused there was parked in
// the aborted transaction only. Rows written before migration 010 read 1:
// they stop rather than re-read.

// ProgressTable is the table of the sink's progress (migration 008).
const ProgressTable = "sink_progress"

// FaultAfterProgress kills the sink after a window's progress row is
// written and before its offsets are committed.
const FaultAfterProgress = "sink.after-progress"

// ErrOffsetsAhead is returned (wrapped) by Run when the group's committed
// offset of an assigned partition is ahead of what the database holds.
var ErrOffsetsAhead = errors.New("committed offsets ahead of the database")

// ErrOffsetsLost is returned (wrapped) by Run when an assigned partition
// has no committed offset but the group recorded progress for it from a
// window that started from a committed offset: the group's offsets were
// lost.
var ErrOffsetsLost = errors.New("committed offsets lost")

// ErrOtherGroup is returned (wrapped) by Run when an assigned partition
// has neither a committed offset nor progress recorded by the group, but
// another group recorded progress for it in the database (a new group
// name on an existing database): reading it from the start would park
// the rows refused below that progress a second time.
var ErrOtherGroup = errors.New("database written by another consumer group")

// windowProgress is the offset the window's transaction commits for each
// of its partitions: past its last polled record, or, for a partition
// stopped at a refused row, just past that row (rewind).
func windowProgress(win *window, stops map[tp]stop) map[tp]int64 {
	out := make(map[tp]int64, len(win.last))
	for k, last := range win.last {
		if st, ok := stops[k]; ok && st.offset < last {
			last = st.offset
		}
		out[k] = last + 1
	}
	return out
}

// recordProgress writes the window's progress rows. It runs before the
// transaction commits the same offsets; when it fails the window must not
// commit.
func (w *Writer) recordProgress(ctx context.Context, progress map[tp]int64) error {
	if len(progress) == 0 {
		return nil
	}
	fromCommitted := make(map[tp]bool, len(progress))
	w.mu.Lock()
	for k := range progress {
		// A partition revoked meanwhile (its window cannot commit)
		// records 1: a stop rather than a re-read.
		ps, ok := w.parts[k]
		fromCommitted[k] = !ok || ps.fromCommitted
	}
	w.mu.Unlock()
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.InsertTimeout)
	defer cancel()
	if err := insertProgress(ictx, w.getConn(), w.cfg.Database, w.cfg.Group, progress, fromCommitted, time.Now()); err != nil {
		return err
	}
	// Guarantee: the progress is recorded, the offsets not committed yet
	// (progress ahead of the committed offsets: the normal case on the
	// restart).
	fault.Hit(FaultAfterProgress)
	return nil
}

// recordFirstCommits writes, once the first window of partitions that
// had no committed offset of the group committed, their progress again
// with from_committed = 1: that window's row says 0, and the group's
// offsets, lost later, would otherwise read as a crash before the first
// commit. On a tie of next_offset, 1 wins (progressQuery). A failure
// only delays it: the partition's next window, or the next check on
// assignment, records 1.
func (w *Writer) recordFirstCommits(ctx context.Context, first map[tp]int64) {
	if len(first) == 0 {
		return
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.InsertTimeout)
	defer cancel()
	if err := insertProgress(ictx, w.getConn(), w.cfg.Database, w.cfg.Group, first, committedParts(first), time.Now()); err != nil {
		w.log.Warn("cannot record that the group committed these partitions for the first time; the next window of each records it", zap.Error(err))
	}
}

// insertProgress writes one progress row of group per partition, in one
// INSERT; fromCommitted says, per partition, whether its window started
// from a committed offset of the group.
func insertProgress(ctx context.Context, conn driver.Conn, db, group string, progress map[tp]int64, fromCommitted map[tp]bool, now time.Time) error {
	var rows [][]any
	for _, k := range sortedParts(progress) {
		fc := uint8(0)
		if fromCommitted[k] {
			fc = 1
		}
		rows = append(rows, []any{group, k.topic, k.p, uint64(progress[k]), now.UTC(), fc})
	}
	if err := insertRows(ctx, conn, "INSERT INTO "+db+"."+ProgressTable+
		" (consumer_group, kafka_topic, kafka_partition, next_offset, written_at, from_committed)", rows); err != nil {
		return fmt.Errorf("sink: record progress in %s: %w", ProgressTable, err)
	}
	return nil
}

// insertRows writes rows with the INSERT query in one batch.
func insertRows(ctx context.Context, conn driver.Conn, query string, rows [][]any) error {
	b, err := conn.PrepareBatch(ctx, query)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if err := b.Append(r...); err != nil {
			_ = b.Abort()
			return err
		}
	}
	return b.Send()
}

// sortedParts returns the partitions of m by topic and partition.
func sortedParts[V any](m map[tp]V) []tp {
	keys := make([]tp, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	return keys
}

func (k tp) less(o tp) bool { return k.topic < o.topic || k.topic == o.topic && k.p < o.p }

// recorded is what sink_progress says: each partition's progress recorded
// by the group, and whether its window started from a committed offset of
// the group (fromCommitted), the highest recorded by another group (a
// database written under another group name), and whether the database
// carries the adoption marker.
type recorded struct {
	progress      map[tp]int64
	fromCommitted map[tp]bool
	others        map[tp]groupProgress
	adopt         bool
}

// groupProgress is a partition's progress recorded by another group.
type groupProgress struct {
	group    string
	progress int64
}

func (w *Writer) readProgress(ctx context.Context) (recorded, error) {
	return readProgress(ctx, w.getConn(), w.cfg.Database, w.cfg.Group, w.cfg.QueryTimeout)
}

// progressQuery reads the progress of every group and partition, and the
// from_committed of its row (1 when two rows of that progress differ).
func progressQuery(db string) string {
	return "SELECT consumer_group, kafka_topic, kafka_partition, max(next_offset), argMax(from_committed, (next_offset, from_committed)) FROM " + db + "." + ProgressTable +
		" GROUP BY consumer_group, kafka_topic, kafka_partition ORDER BY consumer_group, kafka_topic, kafka_partition"
}

// readProgress reads the progress table of database db for group.
func readProgress(ctx context.Context, conn driver.Conn, db, group string, timeout time.Duration) (recorded, error) {
	q := progressQuery(db)
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rows, err := conn.Query(qctx, q)
	if err != nil {
		return recorded{}, fmt.Errorf("sink: read %s: %w", ProgressTable, err)
	}
	defer rows.Close()
	out := recorded{progress: map[tp]int64{}, fromCommitted: map[tp]bool{}, others: map[tp]groupProgress{}}
	for rows.Next() {
		var g, topic string
		var p int32
		var off uint64
		var fc uint8
		if err := rows.Scan(&g, &topic, &p, &off, &fc); err != nil {
			return recorded{}, fmt.Errorf("sink: read %s: %w", ProgressTable, err)
		}
		k := tp{topic, p}
		switch {
		case topic == "" && g == "":
			out.adopt = true
		case topic == "":
		case g == group:
			out.progress[k] = int64(off)
			out.fromCommitted[k] = fc != 0
		default:
			if o, ok := out.others[k]; !ok || int64(off) > o.progress || int64(off) == o.progress && g < o.group {
				out.others[k] = groupProgress{group: g, progress: int64(off)}
			}
		}
	}
	if err := rows.Err(); err != nil {
		return recorded{}, fmt.Errorf("sink: read %s: %w", ProgressTable, err)
	}
	return out, nil
}

// uncheckedParts returns the assigned partitions whose committed offset
// was not compared with the recorded progress yet, with their state.
func (w *Writer) uncheckedParts() map[tp]*pstate {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[tp]*pstate{}
	for k, ps := range w.parts {
		if !ps.checked {
			out[k] = ps
		}
	}
	return out
}

// markChecked marks the partitions checked, unless one was revoked and
// assigned again meanwhile (a new state, whose offset was not checked),
// with the progress below which rereads are read again.
func (w *Writer) markChecked(parts map[tp]*pstate, rereads map[tp]int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, ps := range parts {
		if w.parts[k] == ps {
			ps.checked = true
			ps.reread = rereadState{progress: rereads[k]}
		}
	}
	w.checkErr = ""
}

// anyUnchecked reports whether an assigned partition is not checked yet.
// w.mu is held.
func (w *Writer) anyUnchecked() bool {
	for _, ps := range w.parts {
		if !ps.checked {
			return true
		}
	}
	return false
}

// checkFailed records why an attempt of checkAssigned failed, for Ready.
func (w *Writer) checkFailed(err error) {
	w.mu.Lock()
	w.checkErr = err.Error()
	w.mu.Unlock()
}

// checkAssigned compares the committed offset of every newly assigned
// partition with the recorded progress before any of its records is
// used. It retries while ClickHouse or Kafka cannot answer (fetching
// waits meanwhile) and returns an error wrapping ErrOffsetsAhead when the
// offsets are ahead of the database, or ErrTopicRecreated when a topic is
// not the log the database recorded (checkTopicIDs).
func (w *Writer) checkAssigned(ctx context.Context) error {
	backoff := 200 * time.Millisecond
	var unknownSince time.Time // of the current spell of unknown error codes
	for {
		parts := w.uncheckedParts()
		if len(parts) == 0 {
			return nil
		}
		committed := make(map[tp]int64, len(parts))
		w.mu.Lock()
		for k, ps := range parts {
			committed[k] = ps.committed
		}
		w.mu.Unlock()
		rereads, err := w.checkOffsets(ctx, committed)
		if err == nil {
			// Again: a partition may have been assigned meanwhile.
			w.markChecked(parts, rereads)
			continue
		}
		if errors.Is(err, ErrOffsetsAhead) || errors.Is(err, ErrOffsetsLost) || errors.Is(err, ErrOtherGroup) ||
			errors.Is(err, ErrTopicRecreated) || ctx.Err() != nil {
			return err
		}
		if err := w.checkSpell(err, &unknownSince); err != nil {
			return err
		}
		w.log.Warn("cannot compare the committed offsets of newly assigned partitions with the recorded progress; retrying", zap.Error(err))
		w.checkFailed(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// checkSpell bounds checkAssigned's retries as unknownSpell bounds the
// inserter's (it runs on the run loop, beside the inserter, so it keeps
// its own spell in *since): a login ClickHouse refuses stops the sink at
// once, and an error code the sink does not know once it has lasted
// UnknownErrorLimit. Any other failure ends the spell.
func (w *Writer) checkSpell(err error, since *time.Time) error {
	if isAuthErr(err) {
		s := w.cfg.ClickHouseServer
		return fmt.Errorf("%w: %s refused user %q while the sink runs (checking newly assigned partitions): %v; the password is read at start only: restart the sink with the current one",
			ErrAuthentication, s.Addr, s.user(), err)
	}
	if classify(err) != classUnknown {
		*since = time.Time{}
		return nil
	}
	if since.IsZero() {
		*since = time.Now()
	}
	if spell := time.Since(*since); spell >= w.cfg.UnknownErrorLimit {
		return fmt.Errorf("sink: %w: checking newly assigned partitions against %s failing for %s: %v; fix the server or the table and restart",
			ErrUnknownServerError, ProgressTable, spell.Round(time.Second), err)
	}
	return nil
}

// ahead is a partition whose committed offset is past what the database
// holds (progress -1: none recorded), or, committed -1, one with recorded
// progress and no committed offset.
type ahead struct {
	k                   tp
	committed, progress int64
	// by is the group that recorded progress, when another group did.
	by       string
	logStart int64
}

// effective is the progress that a committed offset of partition k is
// compared with: the highest recorded by any group (records below it are
// in the tables, whoever wrote them), and the group that recorded it ("":
// this one). ok is false when no group recorded any.
func (rec recorded) effective(k tp) (progress int64, by string, ok bool) {
	progress, ok = rec.progress[k]
	if o, other := rec.others[k]; other && (!ok || o.progress > progress) {
		return o.progress, o.group, true
	}
	return progress, "", ok
}

// needsStart says whether classifying partition k, with committed offset
// committed (-1: none), needs its log start offset.
func (rec recorded) needsStart(k tp, committed int64) bool {
	_, own := rec.progress[k]
	_, other := rec.others[k]
	// A committed offset ahead of the progress: the error says whether
	// the records in between are still in the log to be written.
	progress, _, ok := rec.effective(k)
	return !own && committed > 0 || own && committed < 0 || !own && other && committed < 0 ||
		ok && committed > progress
}

// verdict is what the check on assignment makes of one partition.
type verdict int

const (
	verdictOK verdict = iota
	// verdictAdopted: no progress, accepted under the adoption marker.
	verdictAdopted
	// verdictBad: the sink stops (ahead says why).
	verdictBad
)

// classify compares partition k's committed offset (-1: none) with what
// the database records, given its log start offset (when needsStart).
func (rec recorded) classify(k tp, committed, start int64) (verdict, ahead) {
	own, hasOwn := rec.progress[k]
	other, hasOther := rec.others[k]
	progress, by, ok := rec.effective(k)
	switch {
	case committed < 0 && hasOwn && rec.fromCommitted[k]:
		// The group's offsets were lost: its progress was recorded
		// by a window that started from a committed offset (docs/design.md,
		// The ClickHouse ledger, "Offsets ahead of the tables": no silent
		// reset).
		return verdictBad, ahead{k: k, committed: -1, progress: own, logStart: start}
	case committed < 0 && hasOwn:
		// A restart after a crash before the partition's first
		// commit: it reads from the earliest offset, the resume
		// lookup skips the rows already in the tables, and reread.go
		// parks no refused row twice.
		return verdictOK, ahead{}
	case committed < 0 && hasOther && start < other.progress:
		// Another group wrote this partition's records into this
		// database: a new group name on an existing database. Reading
		// from the start would park its refused rows a second time, and
		// two groups writing one database write every new row twice.
		return verdictBad, ahead{k: k, committed: -1, progress: other.progress, by: other.group, logStart: start}
	case committed < 0:
		return verdictOK, ahead{}
	case ok && committed > progress:
		return verdictBad, ahead{k: k, committed: committed, progress: progress, by: by, logStart: start}
	case ok:
		// Progress at or past the committed offset: normal (a window
		// recorded its progress, then its commit failed or was never
		// made, or was fenced: a zombie's).
		return verdictOK, ahead{}
	case committed <= start:
		// Nothing lies between the partition's start and the offset.
		return verdictOK, ahead{}
	case rec.adopt:
		return verdictAdopted, ahead{}
	default:
		return verdictBad, ahead{k: k, committed: committed, progress: -1, logStart: start}
	}
}

// logStarts returns the log start offset of each partition of parts.
func logStarts(ctx context.Context, adm *kadm.Client, parts []tp, timeout time.Duration) (map[tp]int64, error) {
	starts := map[tp]int64{}
	if len(parts) == 0 {
		return starts, nil
	}
	topics := map[string]bool{}
	for _, k := range parts {
		topics[k.topic] = true
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	offs, err := adm.ListStartOffsets(lctx, names...)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("sink: log start offsets: %w", err)
	}
	for _, k := range parts {
		o, ok := offs.Lookup(k.topic, k.p)
		if !ok {
			return nil, fmt.Errorf("sink: no log start offset for %s partition %d", k.topic, k.p)
		}
		starts[k] = o.Offset
	}
	return starts, nil
}

// checkOffsets checks the committed offsets of parts (-1: none) against
// the recorded progress and returns those read again below it (rereads).
func (w *Writer) checkOffsets(ctx context.Context, parts map[tp]int64) (map[tp]int64, error) {
	adm := kadm.NewClient(w.sess.Client())
	if err := w.checkTopicIDs(ctx, adm, topicsOf(parts)); err != nil {
		return nil, err
	}
	rec, err := w.readProgress(ctx)
	if err != nil {
		return nil, err
	}
	// Partitions with a committed offset and no progress: compare with
	// their log start offset (a committed offset there skips nothing).
	// Partitions with progress (or another group's) and no committed
	// offset: likewise (the error names it; for another group's, a log
	// starting at or past that progress reads nothing again).
	var missing []tp
	for k, committed := range parts {
		if rec.needsStart(k, committed) {
			missing = append(missing, k)
		}
	}
	starts, err := logStarts(ctx, adm, missing, w.cfg.QueryTimeout)
	if err != nil {
		return nil, err
	}
	var bad []ahead
	var adopted []string
	for k, committed := range parts {
		switch v, b := rec.classify(k, committed, starts[k]); v {
		case verdictAdopted:
			adopted = append(adopted, fmt.Sprintf("%s/%d@%d", k.topic, k.p, committed))
		case verdictBad:
			bad = append(bad, b)
		}
	}
	if len(adopted) > 0 {
		sort.Strings(adopted)
		w.log.Warn("no recorded progress for these partitions in a database that held rows before progress was recorded: their committed offsets are accepted (topic/partition@offset); their progress is recorded from their next window",
			zap.Strings("partitions", adopted))
	}
	if len(bad) == 0 {
		// A first commit whose progress row with from_committed = 1 was
		// not written (recordFirstCommits failed, or a crash came
		// first): the group has an offset now.
		first := map[tp]int64{}
		for k, committed := range parts {
			if own, ok := rec.progress[k]; ok && committed >= 0 && !rec.fromCommitted[k] {
				first[k] = own
			}
		}
		w.recordFirstCommits(ctx, first)
		return w.rereads(rec, parts), nil
	}
	sort.Slice(bad, func(i, j int) bool { return bad[i].k.less(bad[j].k) })
	msgs := make([]string, len(bad))
	kinds := map[error]bool{}
	for i, b := range bad {
		msgs[i] = w.describeAhead(b)
		what, kind := "committed offset ahead of the database: stopping", ErrOffsetsAhead
		switch {
		case b.committed < 0 && b.by != "":
			what, kind = "no committed offset and no progress for a partition another group recorded progress for: stopping", ErrOtherGroup
		case b.committed < 0:
			what, kind = "no committed offset for a partition with recorded progress: stopping", ErrOffsetsLost
		}
		kinds[kind] = true
		w.log.Error(what, zap.String("topic", b.k.topic), zap.Int32("partition", b.k.p),
			zap.Int64("committed", b.committed), zap.Int64("recorded_progress", b.progress), zap.String("recorded_by", b.by),
			zap.String("what_to_do", msgs[i]))
	}
	var wrapped []any
	var verbs []string
	for _, kind := range []error{ErrOffsetsAhead, ErrOffsetsLost, ErrOtherGroup} {
		if kinds[kind] {
			wrapped = append(wrapped, kind)
			verbs = append(verbs, "%w")
		}
	}
	return nil, fmt.Errorf("sink: "+strings.Join(verbs, ", ")+": %s", append(wrapped, strings.Join(msgs, "; "))...)
}

// describeAhead says what is wrong with one partition and the command that
// repairs it.
func (w *Writer) describeAhead(b ahead) string {
	brokers := strings.Join(w.cfg.Kafka.Brokers, ",")
	reset := fmt.Sprintf("stop every sink of the group, then run: kafka-consumer-groups.sh --bootstrap-server %s --group %s --topic %s:%d --reset-offsets",
		brokers, w.cfg.Group, b.k.topic, b.k.p)
	switch {
	case b.committed < 0 && b.by != "":
		return fmt.Sprintf("group %s has no committed offset and no progress for %s partition %d, but in database %s group %s recorded progress %d for it in %s (a new group name on an existing database?), and the partition starts at %d: reading it again from the start would park the rows refused below %d in %s a second time, and two groups writing one database write every new row twice. Run the sink with --group %s; or, if group %s is retired, stop every sink of both groups, then run: kafka-consumer-groups.sh --bootstrap-server %s --group %s --topic %s:%d --reset-offsets --to-offset %d --execute",
			w.cfg.Group, b.k.topic, b.k.p, w.cfg.Database, b.by, b.progress, ProgressTable, b.logStart, b.progress, TableRejected, b.by, b.by, brokers, w.cfg.Group, b.k.topic, b.k.p, b.progress)
	case b.committed < 0:
		gone := ""
		if b.logStart > b.progress {
			gone = fmt.Sprintf(" Records %d..%d are no longer in the log and in no table: after the reset the sink stops on them (committed offset ahead of the database) until they are accepted with meterline sink accept-offsets.", b.progress, b.logStart-1)
		}
		return fmt.Sprintf("group %s has no committed offset for %s partition %d (offsets expired after offsets.retention.minutes, or the group was deleted), but database %s records progress %d for it in %s from a committed offset, and the partition starts at %d: not reading it from the start without being told. Reading it again is safe (the rows in the tables are skipped, no refused row is parked twice). To read it from its start, %s --to-earliest --execute; or, to read it from an offset N at or below %d, %s --to-offset N --execute.%s",
			w.cfg.Group, b.k.topic, b.k.p, w.cfg.Database, b.progress, ProgressTable, b.logStart, reset, b.progress, reset, gone)
	}
	accept := fmt.Sprintf("To skip them on purpose instead, stop every sink of the group, then run: meterline sink accept-offsets --group %s --database %s --topic %s --partition %d (it records the gap in %s)",
		w.cfg.Group, w.cfg.Database, b.k.topic, b.k.p, SkipsTable)
	if b.progress < 0 {
		return fmt.Sprintf("group %s has committed offset %d for %s partition %d, but database %s has no progress recorded for it (a new database behind an existing group?) and the partition starts at %d: records %d..%d are in no table of this database. To fill this database from the start of the partition, %s --to-earliest --execute (or use a new --group). %s",
			w.cfg.Group, b.committed, b.k.topic, b.k.p, w.cfg.Database, b.logStart, b.logStart, b.committed-1, reset, accept)
	}
	recordedBy := ""
	if b.by != "" {
		recordedBy = ", recorded by group " + b.by
	}
	head := fmt.Sprintf("group %s has committed offset %d for %s partition %d, but database %s holds that partition's records only below offset %d (its progress in %s%s): records %d..%d are in no table",
		w.cfg.Group, b.committed, b.k.topic, b.k.p, w.cfg.Database, b.progress, ProgressTable, recordedBy, b.progress, b.committed-1)
	if b.logStart <= b.progress {
		return fmt.Sprintf("%s (was the group's offset moved forward?). To write them, %s --to-offset %d --execute. %s",
			head, reset, b.progress, accept)
	}
	// The log no longer holds the records from the progress on: a reset
	// to the progress would only stop the sink with OFFSET_OUT_OF_RANGE.
	gone := fmt.Sprintf("%s, and the partition now starts at %d: records %d..%d are no longer in the log (retention or a deletion removed them) and cannot be written; a reset to %d would stop the sink with OFFSET_OUT_OF_RANGE.",
		head, b.logStart, b.progress, min(b.logStart, b.committed)-1, b.progress)
	skip := fmt.Sprintf("stop every sink of the group, then run: meterline sink accept-offsets --group %s --database %s --topic %s --partition %d (it records the gap in %s)",
		w.cfg.Group, w.cfg.Database, b.k.topic, b.k.p, SkipsTable)
	if b.committed > b.logStart {
		return fmt.Sprintf("%s To write records %d..%d, which the log still holds, %s --to-offset %d --execute, then skip the records that are gone: %s. To skip every record up to the committed offset instead, %s",
			gone, b.logStart, b.committed-1, reset, b.logStart, skip, skip)
	}
	return fmt.Sprintf("%s To go on without them, %s", gone, skip)
}
