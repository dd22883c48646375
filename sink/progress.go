package sink

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

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
// partition, naming the partition, both offsets and the command that
// repairs it.
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
	keys := make([]tp, 0, len(progress))
	for k := range progress {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].topic < keys[j].topic || keys[i].topic == keys[j].topic && keys[i].p < keys[j].p
	})
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.InsertTimeout)
	defer cancel()
	b, err := w.getConn().PrepareBatch(ictx, "INSERT INTO "+w.cfg.Database+"."+ProgressTable+
		" (consumer_group, kafka_topic, kafka_partition, next_offset, written_at)")
	if err != nil {
		return fmt.Errorf("sink: record progress in %s: %w", ProgressTable, err)
	}
	now := time.Now().UTC()
	for _, k := range keys {
		if err := b.Append(w.cfg.Group, k.topic, k.p, uint64(progress[k]), now); err != nil {
			_ = b.Abort()
			return fmt.Errorf("sink: record progress in %s: %w", ProgressTable, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("sink: record progress in %s: %w", ProgressTable, err)
	}
	// Guarantee: the progress is recorded, the offsets not committed yet
	// (progress ahead of the committed offsets: the normal case on the
	// restart).
	fault.Hit(FaultAfterProgress)
	return nil
}

// recorded is what sink_progress says of the group: each partition's
// progress, and whether the database carries the adoption marker.
type recorded struct {
	progress map[tp]int64
	adopt    bool
}

func (w *Writer) readProgress(ctx context.Context) (recorded, error) {
	q := "SELECT kafka_topic, kafka_partition, max(next_offset) FROM " + w.cfg.Database + "." + ProgressTable +
		" WHERE consumer_group IN (" + quote(w.cfg.Group) + ", '') GROUP BY kafka_topic, kafka_partition"
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	rows, err := w.getConn().Query(qctx, q)
	if err != nil {
		return recorded{}, fmt.Errorf("sink: read %s: %w", ProgressTable, err)
	}
	defer rows.Close()
	out := recorded{progress: map[tp]int64{}}
	for rows.Next() {
		var topic string
		var p int32
		var off uint64
		if err := rows.Scan(&topic, &p, &off); err != nil {
			return recorded{}, fmt.Errorf("sink: read %s: %w", ProgressTable, err)
		}
		if topic == "" {
			out.adopt = true
			continue
		}
		out.progress[tp{topic, p}] = int64(off)
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
// assigned again meanwhile (a new state, whose offset was not checked).
func (w *Writer) markChecked(parts map[tp]*pstate) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, ps := range parts {
		if w.parts[k] == ps {
			ps.checked = true
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
		err := w.checkOffsets(ctx, committed)
		if err == nil {
			// Again: a partition may have been assigned meanwhile.
			w.markChecked(parts)
			continue
		}
		if errors.Is(err, ErrOffsetsAhead) || errors.Is(err, ErrOffsetsLost) || ctx.Err() != nil {
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
	logStart            int64
	parked              uint64
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

func (w *Writer) checkOffsets(ctx context.Context, parts map[tp]int64) error {
	rec, err := w.readProgress(ctx)
	if err != nil {
		return err
	}
	// Partitions with a committed offset and no progress: compare with
	// their log start offset (a committed offset there skips nothing).
	// Partitions with progress and no committed offset: likewise (a log
	// starting at or past the progress reads nothing again).
	var missing []tp
	for k, committed := range parts {
		if _, ok := rec.progress[k]; !ok && committed > 0 || ok && committed < 0 {
			missing = append(missing, k)
		}
	}
	starts := map[tp]int64{}
	if len(missing) > 0 {
		topics := map[string]bool{}
		for _, k := range missing {
			topics[k.topic] = true
		}
		names := make([]string, 0, len(topics))
		for t := range topics {
			names = append(names, t)
		}
		lctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
		defer cancel()
		offs, err := kadm.NewClient(w.sess.Client()).ListStartOffsets(lctx, names...)
		if err == nil {
			err = offs.Error()
		}
		if err != nil {
			return fmt.Errorf("sink: log start offsets: %w", err)
		}
		for _, k := range missing {
			o, ok := offs.Lookup(k.topic, k.p)
			if !ok {
				return fmt.Errorf("sink: no log start offset for %s partition %d", k.topic, k.p)
			}
			starts[k] = o.Offset
		}
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
		return err
	}
	var bad []ahead
	var adopted []string
	for k, committed := range parts {
		progress, ok := rec.progress[k]
		switch {
		case committed < 0 && parked[k] > 0:
			// The group's offset was lost: reading from the start would
			// park refused rows again, resuming at the progress could
			// skip the parking of a row refused in a window cut before
			// its commit.
			bad = append(bad, ahead{k: k, committed: -1, progress: progress, logStart: starts[k], parked: parked[k]})
		case committed < 0:
			// A first start (or one after a crash before the first
			// commit), no row parked below the progress, or a log that
			// starts past it: it reads from the earliest offset, and the
			// resume lookup skips the rows already in the tables.
		case ok && committed > progress:
			bad = append(bad, ahead{k: k, committed: committed, progress: progress})
		case ok:
			// Progress at or past the committed offset: normal (a window
			// recorded its progress, then its commit failed or was never
			// made).
		case committed <= starts[k]:
			// Nothing lies between the partition's start and the offset.
		case rec.adopt:
			adopted = append(adopted, fmt.Sprintf("%s/%d@%d", k.topic, k.p, committed))
		default:
			bad = append(bad, ahead{k: k, committed: committed, progress: -1, logStart: starts[k]})
		}
	}
	if len(adopted) > 0 {
		sort.Strings(adopted)
		w.log.Warn("no recorded progress for these partitions in a database that held rows before progress was recorded: their committed offsets are accepted (topic/partition@offset); their progress is recorded from their next window",
			zap.Strings("partitions", adopted))
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Slice(bad, func(i, j int) bool {
		return bad[i].k.topic < bad[j].k.topic || bad[i].k.topic == bad[j].k.topic && bad[i].k.p < bad[j].k.p
	})
	msgs := make([]string, len(bad))
	kinds := map[error]bool{}
	for i, b := range bad {
		msgs[i] = w.describeAhead(b)
		what, kind := "committed offset ahead of the database: stopping", ErrOffsetsAhead
		if b.committed < 0 {
			what, kind = "no committed offset for a partition with recorded progress: stopping", ErrOffsetsLost
		}
		kinds[kind] = true
		w.log.Error(what, zap.String("topic", b.k.topic), zap.Int32("partition", b.k.p),
			zap.Int64("committed", b.committed), zap.Int64("recorded_progress", b.progress), zap.String("what_to_do", msgs[i]))
	}
	switch all := strings.Join(msgs, "; "); {
	case kinds[ErrOffsetsAhead] && kinds[ErrOffsetsLost]:
		return fmt.Errorf("sink: %w, %w: %s", ErrOffsetsAhead, ErrOffsetsLost, all)
	case kinds[ErrOffsetsLost]:
		return fmt.Errorf("sink: %w: %s", ErrOffsetsLost, all)
	default:
		return fmt.Errorf("sink: %w: %s", ErrOffsetsAhead, all)
	}
}

// describeAhead says what is wrong with one partition and the command that
// repairs it.
func (w *Writer) describeAhead(b ahead) string {
	reset := fmt.Sprintf("stop every sink of the group, then run: kafka-consumer-groups.sh --bootstrap-server %s --group %s --topic %s:%d --reset-offsets",
		strings.Join(w.cfg.Kafka.Brokers, ","), w.cfg.Group, b.k.topic, b.k.p)
	if b.committed < 0 {
		return fmt.Sprintf("group %s has no committed offset for %s partition %d (offsets expired after offsets.retention.minutes, or the group was deleted), but database %s records progress %d for it in %s, the partition starts at %d and %d of its rows below the progress are parked in %s: reading it again from the start would park them a second time. Records below %d are in their tables; a row refused below it was parked unless the sink's last window was cut between its progress row and its commit (see docs/operations.md). To resume at the recorded progress, %s --to-offset %d --execute",
			w.cfg.Group, b.k.topic, b.k.p, w.cfg.Database, b.progress, ProgressTable, b.logStart, b.parked, TableRejected, b.progress, reset, b.progress)
	}
	if b.progress < 0 {
		return fmt.Sprintf("group %s has committed offset %d for %s partition %d, but database %s has no progress recorded for it (a new database behind an existing group?) and the partition starts at %d: records %d..%d are in no table of this database. To fill this database from the start of the partition, %s --to-earliest --execute (or use a new --group)",
			w.cfg.Group, b.committed, b.k.topic, b.k.p, w.cfg.Database, b.logStart, b.logStart, b.committed-1, reset)
	}
	return fmt.Sprintf("group %s has committed offset %d for %s partition %d, but database %s holds that partition's records only below offset %d (its progress in %s): records %d..%d are in no table (was the group's offset moved forward?). To write them, %s --to-offset %d --execute",
		w.cfg.Group, b.committed, b.k.topic, b.k.p, w.cfg.Database, b.progress, ProgressTable, b.progress, b.committed-1, reset, b.progress)
}
