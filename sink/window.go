package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/session"
)

// Commit windows: the records polled since the last commit, which one
// Kafka transaction commits (docs/design.md, The ClickHouse ledger), and
// the INSERT batches they are decoded into.
//
// Guarantee kept here: a window's offsets are committed only after every
// INSERT batch of the window was written (the inserter, inserter.go) and
// in the same transaction as the rows it parks (commit.go). A record that
// does not decode is parked in that transaction too (docs/design.md, Bad
// input: bad input never disappears); one of usage.rejected is quarantined
// instead (park.go), never parked again.

// window is the records polled since the last commit: one transaction.
type window struct {
	records int
	start   time.Time
	last    map[tp]int64   // highest polled offset per partition
	offs    map[tp][]int64 // polled offsets per partition
	parks   []decodePark   // records that did not decode, parked
}

// decodePark is a polled record that did not decode, and its Rejected
// record.
type decodePark struct {
	src tp
	off int64
	rec *kgo.Record
}

// stop is the first row of a partition that ClickHouse refused in a
// commit window: it is parked, and the partition's rows after it are held
// back until the window's transaction committed.
type stop struct {
	offset int64
	epoch  int32 // the record's leader epoch, for the rewound offset
}

// heldBack reports whether a row of partition k at offset off must not be
// inserted in this window.
func heldBack(stops map[tp]stop, k tp, off int64) bool {
	s, ok := stops[k]
	return ok && off > s.offset
}

// parksBefore returns the window's records that did not decode, except
// those held back behind a stop: such a record is fetched again after
// this window's commit, and parked then — not now, or twice.
func (win *window) parksBefore(stops map[tp]stop) []decodePark {
	if len(stops) == 0 {
		return win.parks
	}
	var out []decodePark
	for _, d := range win.parks {
		if !heldBack(stops, d.src, d.off) {
			out = append(out, d)
		}
	}
	return out
}

func newWindow() *window { return &window{last: map[tp]int64{}, offs: map[tp][]int64{}} }

// heldRecords counts the window's records held back behind stops (fetched
// again after the commit).
func (win *window) heldRecords(stops map[tp]stop) int {
	n := 0
	for k, st := range stops {
		for _, off := range win.offs[k] {
			if off > st.offset {
				n++
			}
		}
	}
	return n
}

// pending is the rows of one INSERT batch (per table) being filled.
type pending struct {
	records int
	bytes   int64 // of its records (recordBytes)
	start   time.Time
	rows    map[*table][]*row
	// quarantine: records of the rejected topic that did not decode, for
	// usage_quarantine.
	quarantine []*row
}

func newPending() *pending { return &pending{rows: map[*table][]*row{}} }

// recordBytes is what a record counts towards MaxBatchBytes: its key,
// value and headers.
func recordBytes(r *kgo.Record) int64 {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// full reports whether the batch must close before r is added: the
// record would take it past MaxBatchBytes (r nil: it is at either bound).
// A batch closes for either bound alike; the window, the progress and the
// parks do not depend on where batches end, only on their order.
func (w *Writer) full(cur *pending, r *kgo.Record) bool {
	if cur.records == 0 {
		return false
	}
	if r == nil {
		return cur.records >= w.cfg.MaxBatchRecords || cur.bytes >= w.cfg.MaxBatchBytes
	}
	return cur.bytes+recordBytes(r) > w.cfg.MaxBatchBytes
}

// add decodes one polled record into the window and the pending batch.
func (w *Writer) add(win *window, cur *pending, r *kgo.Record, now time.Time) error {
	t, ok := w.byTopic[r.Topic]
	if !ok {
		return nil
	}
	if win.records == 0 {
		win.start = now
	}
	if cur.records == 0 {
		cur.start = now
	}
	win.records++
	cur.records++
	cur.bytes += recordBytes(r)
	k := tp{r.Topic, r.Partition}
	win.last[k] = r.Offset
	win.offs[k] = append(win.offs[k], r.Offset)
	t.recordsIn.Inc()
	row, err := t.buildRow(r)
	switch {
	case err != nil && t.rejected:
		// Never parked again (it would loop): written to usage_quarantine
		// by the inserter, before this window's offsets are committed.
		cur.quarantine = append(cur.quarantine, quarantineRow(r, decodeReason(err), fmt.Sprintf("sink: %s: %v", t.name, err)))
	case err != nil:
		reason := decodeReason(err)
		rec, perr := w.parkRecord(r, identity{}, reason, fmt.Sprintf("sink: %s: %v", t.name, err))
		if perr != nil {
			return perr
		}
		win.parks = append(win.parks, decodePark{src: tp{r.Topic, r.Partition}, off: r.Offset, rec: rec})
	case row != nil:
		cur.rows[t] = append(cur.rows[t], row)
	default:
		t.timeIn.Inc() // a watermark record: no row, and no event
	}
	return nil
}

// runWindows polls, decodes the records into the window and the pending
// INSERT batch, hands full or due batches to the inserter, and ends the
// window when it is due (CommitInterval) or a refused row stopped a
// partition. When ctx ends it ends the window in hand and returns.
func (w *Writer) runWindows(ctx context.Context, ins *inserter) error {
	win, cur := newWindow(), newPending()
	// closeWindow inserts what is pending, waits for every INSERT of the
	// window, and ends its transaction.
	closeWindow := func() error {
		if cur.records > 0 {
			ins.dispatch(cur)
			cur = newPending()
		}
		parks, stops, held, err := ins.wait()
		abandon := errors.Is(err, errAbandon)
		if err != nil && !abandon {
			return err
		}
		err = w.commit(ctx, win, parks, stops, held, abandon)
		win = newWindow()
		return err
	}
	for {
		if ctx.Err() != nil {
			if win.records > 0 {
				if err := closeWindow(); err != nil {
					return err
				}
			}
			return ctx.Err()
		}
		wait, pctx, endPoll := w.cfg.CommitInterval, ctx, func() {}
		if win.records > 0 {
			wait = time.Until(win.start.Add(w.cfg.CommitInterval))
		} else {
			// Nothing in hand: a login refused stops the sink here.
			if err := w.refusedIdle(); err != nil {
				return err
			}
			pctx, endPoll = w.idleCtx(ctx)
		}
		if cur.records > 0 {
			wait = min(wait, time.Until(cur.start.Add(w.cfg.MaxBatchWait)))
		}
		fs := w.poll(pctx, wait, w.cfg.MaxBatchRecords-cur.records)
		endPoll()
		if err := session.FetchError(w.log, w.cfg.Kafka.Principal(), w.cfg.Group, fs); err != nil {
			return w.fetchFailed(ctx, err)
		}
		// Newly assigned partitions (their records may be in these
		// fetches) are checked against the recorded progress first.
		// On an error the window in hand is not committed: the records
		// just polled are in none of its batches.
		if err := w.checkAssigned(ctx); err != nil {
			return err
		}
		var derr error
		polled := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			if derr != nil {
				return
			}
			// A poll returns up to the records the batch lacks, whatever
			// their bytes: the batch closes before the record that would
			// take it past MaxBatchBytes, in the middle of the poll.
			if w.full(cur, r) {
				ins.dispatch(cur)
				cur = newPending()
			}
			derr = w.add(win, cur, r, polled)
		})
		if derr != nil {
			return derr
		}
		now := time.Now()
		if cur.records > 0 && (w.full(cur, nil) || !now.Before(cur.start.Add(w.cfg.MaxBatchWait))) {
			// Blocks while the inserter has a batch in hand and one
			// queued: polling stops, so a slow or unavailable ClickHouse
			// holds back fetching.
			ins.dispatch(cur)
			cur = newPending()
		}
		// A refused row ends the window early: it is parked, and its
		// partition's later rows are held back until that commits.
		if win.records > 0 && (!now.Before(win.start.Add(w.cfg.CommitInterval)) || ins.stopped.Load()) {
			if err := closeWindow(); err != nil {
				return err
			}
		}
	}
}
