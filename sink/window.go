package sink

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Commit windows: the records polled since the last commit, which one
// Kafka transaction commits (DESIGN §7), and the INSERT batches they are
// decoded into.
//
// Guarantee kept here: a window's offsets are committed only after every
// INSERT batch of the window was written (the inserter, inserter.go) and
// in the same transaction as the rows it parks (commit.go). A record that
// does not decode is parked in that transaction too (DESIGN §8: bad input
// never disappears); one of usage.rejected is quarantined instead
// (park.go), never parked again.

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
	start   time.Time
	rows    map[*table][]*row
	// quarantine: records of the rejected topic that did not decode, for
	// usage_quarantine.
	quarantine []*row
}

func newPending() *pending { return &pending{rows: map[*table][]*row{}} }

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
	}
	return nil
}
