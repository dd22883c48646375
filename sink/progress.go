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
// check of the group's committed offsets against it on assignment (DESIGN
// §6.6: offsets are never reset silently).
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
// read from its start: normal after a crash before the group's first
// commit (the progress of a window cut before its commit). When the
// group's offsets were lost instead (expired after
// offsets.retention.minutes, or the group deleted), the resume lookup
// skips the rows already in the tables, but rows ClickHouse refused and
// the sink parked would be parked a second time (DESIGN §7). Resuming at
// the recorded progress is not always sound either: a window cut between
// its progress row and its commit leaves progress above the offset really
// committed, and a row refused in between was parked in the aborted
// transaction only. So when usage_rejected holds a row the sink parked
// from such a partition below its progress, the sink stops before it
// consumes anything of the partition (ErrOffsetsLost), naming it, its
// progress and the command that sets the offset; unless the partition's
// log now starts at or past the progress (nothing below it is read
// again).

// ProgressTable is the table of the sink's progress (migration 008).
const ProgressTable = "sink_progress"

// FaultAfterProgress kills the sink after a window's progress row is
// written and before its offsets are committed.
const FaultAfterProgress = "sink.after-progress"

// ErrOffsetsAhead is returned (wrapped) by Run when the group's committed
// offset of an assigned partition is ahead of what the database holds.
var ErrOffsetsAhead = errors.New("committed offsets ahead of the database")

// ErrOffsetsLost is returned (wrapped) by Run when an assigned partition
// has no committed offset but the database records progress for it, and
// rows parked from it below the progress that reading it again would
// park twice.
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
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.InsertTimeout)
	defer cancel()
	if err := insertProgress(ictx, w.getConn(), w.cfg.Database, w.cfg.Group, progress, time.Now()); err != nil {
		return err
	}
	// Guarantee: the progress is recorded, the offsets not committed yet
	// (progress ahead of the committed offsets: the normal case on the
	// restart).
	fault.Hit(FaultAfterProgress)
	return nil
}

// insertProgress writes one progress row of group per partition, in one
// INSERT.
func insertProgress(ctx context.Context, conn driver.Conn, db, group string, progress map[tp]int64, now time.Time) error {
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+"."+ProgressTable+
		" (consumer_group, kafka_topic, kafka_partition, next_offset, written_at)")
	if err != nil {
		return fmt.Errorf("sink: record progress in %s: %w", ProgressTable, err)
	}
	for _, k := range sortedParts(progress) {
		if err := b.Append(group, k.topic, k.p, uint64(progress[k]), now.UTC()); err != nil {
			_ = b.Abort()
			return fmt.Errorf("sink: record progress in %s: %w", ProgressTable, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("sink: record progress in %s: %w", ProgressTable, err)
	}
	return nil
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
// by the group, the highest recorded by another group (a database written
// under another group name), and whether the database carries the
// adoption marker.
type recorded struct {
	progress map[tp]int64
	others   map[tp]groupProgress
	adopt    bool
}

// groupProgress is a partition's progress recorded by another group.
type groupProgress struct {
	group    string
	progress int64
}

func (w *Writer) readProgress(ctx context.Context) (recorded, error) {
	return readProgress(ctx, w.getConn(), w.cfg.Database, w.cfg.Group, w.cfg.QueryTimeout)
}

// progressQuery reads the progress of every group and partition.
func progressQuery(db string) string {
	return "SELECT consumer_group, kafka_topic, kafka_partition, max(next_offset) FROM " + db + "." + ProgressTable +
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
	out := recorded{progress: map[tp]int64{}, others: map[tp]groupProgress{}}
	for rows.Next() {
		var g, topic string
		var p int32
		var off uint64
		if err := rows.Scan(&g, &topic, &p, &off); err != nil {
			return recorded{}, fmt.Errorf("sink: read %s: %w", ProgressTable, err)
		}
		k := tp{topic, p}
		switch {
		case topic == "" && g == "":
			out.adopt = true
		case topic == "":
		case g == group:
			out.progress[k] = int64(off)
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
}

// checkAssigned compares the committed offset of every newly assigned
// partition with the recorded progress before any of its records is
// used. It retries while ClickHouse or Kafka cannot answer (fetching
// waits meanwhile) and returns an error wrapping ErrOffsetsAhead when the
// offsets are ahead of the database.
func (w *Writer) checkAssigned(ctx context.Context) error {
	backoff := 200 * time.Millisecond
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
		if errors.Is(err, ErrOffsetsAhead) || errors.Is(err, ErrOffsetsLost) || errors.Is(err, ErrOtherGroup) || ctx.Err() != nil {
			return err
		}
		w.log.Warn("cannot compare the committed offsets of newly assigned partitions with the recorded progress; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
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
	parked   uint64
}

// parkedBelow counts, per partition of parts, the rows of usage_rejected
// the sink parked from it below its progress.
func (w *Writer) parkedBelow(ctx context.Context, parts []tp, progress map[tp]int64) (map[tp]uint64, error) {
	out := map[tp]uint64{}
	if len(parts) == 0 {
		return out, nil
	}
	conds := make([]string, len(parts))
	for i, k := range parts {
		conds[i] = fmt.Sprintf("(source_topic = %s AND source_partition = %d AND source_offset < %d)", quote(k.topic), k.p, progress[k])
	}
	q := "SELECT source_topic, source_partition, count() FROM " + w.cfg.Database + "." + TableRejected +
		" WHERE stage = 'sink' AND (" + strings.Join(conds, " OR ") + ") GROUP BY source_topic, source_partition"
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	rows, err := w.getConn().Query(qctx, q)
	if err != nil {
		return nil, fmt.Errorf("sink: rows parked below the recorded progress: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		var p int32
		var n uint64
		if err := rows.Scan(&topic, &p, &n); err != nil {
			return nil, fmt.Errorf("sink: rows parked below the recorded progress: %w", err)
		}
		out[tp{topic, p}] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sink: rows parked below the recorded progress: %w", err)
	}
	return out, nil
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
	return !own && committed > 0 || own && committed < 0 || !own && other && committed < 0
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
// the database records, given its log start offset (when needsStart) and
// the number of rows the sink parked from it below the group's own
// progress (when the offset is missing).
func (rec recorded) classify(k tp, committed, start int64, parked uint64) (verdict, ahead) {
	own, hasOwn := rec.progress[k]
	other, hasOther := rec.others[k]
	progress, by, ok := rec.effective(k)
	switch {
	case committed < 0 && hasOwn && parked > 0:
		// The group's offset was lost: reading from the start would
		// park refused rows again, resuming at the progress could
		// skip the parking of a row refused in a window cut before
		// its commit.
		return verdictBad, ahead{k: k, committed: -1, progress: own, logStart: start, parked: parked}
	case committed < 0 && hasOwn:
		// A first start (or one after a crash before the first
		// commit), no row parked below the progress, or a log that
		// starts past it: it reads from the earliest offset, and the
		// resume lookup skips the rows already in the tables.
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
		return verdictBad, ahead{k: k, committed: committed, progress: progress, by: by}
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
	rec, err := w.readProgress(ctx)
	if err != nil {
		return nil, err
	}
	// Partitions with a committed offset and no progress: compare with
	// their log start offset (a committed offset there skips nothing).
	// Partitions with progress (or another group's) and no committed
	// offset: likewise (a log starting at or past the progress reads
	// nothing again).
	var missing []tp
	for k, committed := range parts {
		if rec.needsStart(k, committed) {
			missing = append(missing, k)
		}
	}
	starts, err := logStarts(ctx, kadm.NewClient(w.sess.Client()), missing, w.cfg.QueryTimeout)
	if err != nil {
		return nil, err
	}
	// Partitions with progress, no committed offset and records below the
	// progress: how many rows the sink parked from them below it.
	var lost []tp
	for k, committed := range parts {
		if progress, ok := rec.progress[k]; ok && committed < 0 && starts[k] < progress {
			lost = append(lost, k)
		}
	}
	parked, err := w.parkedBelow(ctx, lost, rec.progress)
	if err != nil {
		return nil, err
	}
	var bad []ahead
	var adopted []string
	for k, committed := range parts {
		switch v, b := rec.classify(k, committed, starts[k], parked[k]); v {
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
		return fmt.Sprintf("group %s has no committed offset for %s partition %d (offsets expired after offsets.retention.minutes, or the group was deleted), but database %s records progress %d for it in %s, the partition starts at %d and %d of its rows below the progress are parked in %s: reading it again from the start would park them a second time. Records below %d are in their tables; a row refused below it was parked unless the sink's last window was cut between its progress row and its commit (see docs/operations.md). To resume at the recorded progress, %s --to-offset %d --execute",
			w.cfg.Group, b.k.topic, b.k.p, w.cfg.Database, b.progress, ProgressTable, b.logStart, b.parked, TableRejected, b.progress, reset, b.progress)
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
	return fmt.Sprintf("group %s has committed offset %d for %s partition %d, but database %s holds that partition's records only below offset %d (its progress in %s%s): records %d..%d are in no table (was the group's offset moved forward?). To write them, %s --to-offset %d --execute. %s",
		w.cfg.Group, b.committed, b.k.topic, b.k.p, w.cfg.Database, b.progress, ProgressTable, recordedBy, b.progress, b.committed-1, reset, b.progress, accept)
}
