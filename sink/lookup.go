package sink

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"
)

// The resume lookup (docs/design.md, The ClickHouse ledger, "Exactly once
// into ClickHouse"): on assignment, and whenever rows at or after a
// partition's committed offset may already be in its table, skip each row
// whose (partition, offset) the table holds.
//
// Guarantee kept here: no row is written twice, whatever the crash —
// between an INSERT and the offset commit, or during an INSERT that wrote
// only some of its parts. The lookup covers only offsets at or after the
// committed offset and names the 65,536-offset chunks of the tables' sort
// key, so it reads a bounded number of rows at any table size.

// rangeConds returns one lookup condition per partition of spans (spansOf)
// covering its rows' offsets: the range from the lowest to the highest,
// and its chunks, for the primary index. The lookup's answer may hold
// offsets in between that are not the rows'; the caller checks each row.
// A range, not a list of every offset: a batch of 50,000 offsets in an IN
// list is a query longer than the server's max_query_size (256 KiB),
// refused on every retry.
func rangeConds(spans map[int32][2]int64) []string {
	conds := make([]string, 0, len(spans))
	for _, p := range sortedKeys(spans) {
		lo, hi := spans[p][0], spans[p][1]
		conds = append(conds, fmt.Sprintf("(kafka_partition = %d AND intDiv(kafka_offset, %d) BETWEEN %d AND %d AND kafka_offset BETWEEN %d AND %d)",
			p, resumeChunk, lo/resumeChunk, hi/resumeChunk, lo, hi))
	}
	return conds
}

// filterPresent applies the resume rule: for the rows' dirty partitions, it
// drops the rows whose (partition, offset) the table already holds.
func (w *Writer) filterPresent(ctx context.Context, t *table, rows []*row) ([]*row, error) {
	spans := spansOf(rows)
	dirty, unknown, err := w.dirtyParts(t, spans)
	if err != nil || len(dirty) == 0 {
		return rows, err
	}
	// 1. The highest offset ≥ committed already in the table, per partition
	// (once per dirty spell). The query also covers the topic's other
	// dirty partitions whose lower bound is known, so that an assignment
	// costs one query per table, not one per batch.
	if len(unknown) > 0 {
		if err := w.lookupMax(ctx, t, dirty, unknown); err != nil {
			return nil, err
		}
	}
	// 2. Which of the rows' offsets are there.
	conds := presentConds(spans, dirty)
	if len(conds) == 0 {
		return rows, nil
	}
	present, err := w.lookupRows(ctx, t, "kafka_offset", conds, false)
	if err != nil {
		return nil, err
	}
	if len(present) == 0 {
		return rows, nil
	}
	out := make([]*row, 0, len(rows))
	skipped := 0
	for _, r := range rows {
		if present.has(r.partition(), r.offset()) {
			skipped++
			continue
		}
		out = append(out, r)
	}
	if skipped > 0 {
		w.m.rows.WithLabelValues(t.name, outcomePresent).Add(float64(skipped))
		w.log.Info("resume rule: rows already in the table skipped", zap.String("table", t.name), zap.Int("rows", skipped))
	}
	return out, nil
}

// dirtyPart is a dirty partition's state as the resume lookup found it,
// and the lowest and highest offset of its rows in the batch (lo > hi: it
// has none, it is looked up for its highest present offset only).
type dirtyPart struct {
	ps             *pstate
	committed, max int64
	maxKnown       bool
	lo, hi         int64
}

// dirtyParts snapshots the state of the dirty partitions among the rows'
// (spans, spansOf), and, when there are any, of the topic's other dirty
// partitions whose highest present offset is not known yet; unknown lists
// the partitions, of both kinds, whose highest present offset the lookup
// must read first. It returns errAbandon when one of the rows' partitions
// was revoked: the window cannot commit.
func (w *Writer) dirtyParts(t *table, spans map[int32][2]int64) (dirty map[int32]*dirtyPart, unknown []int32, err error) {
	dirty = map[int32]*dirtyPart{}
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, s := range spans {
		ps, ok := w.parts[tp{t.topic, p}]
		if !ok {
			return nil, nil, errAbandon
		}
		if ps.committed < 0 {
			// No committed offset: the first row consumed is the lower
			// bound. Rows at lower offsets can never be consumed again,
			// and the records between the partition's start and this row
			// were not rows.
			ps.committed = s[0]
		}
		if ps.dirty {
			dirty[p] = &dirtyPart{ps: ps, committed: ps.committed, max: ps.presentMax, maxKnown: ps.maxKnown, lo: s[0], hi: s[1]}
		}
	}
	if len(dirty) == 0 {
		return nil, nil, nil
	}
	for k, ps := range w.parts {
		if k.topic != t.topic || !ps.dirty || ps.maxKnown || ps.committed < 0 {
			continue
		}
		unknown = append(unknown, k.p)
		if _, ok := dirty[k.p]; !ok {
			dirty[k.p] = &dirtyPart{ps: ps, committed: ps.committed, lo: -1, hi: -2}
		}
	}
	sort.Slice(unknown, func(i, j int) bool { return unknown[i] < unknown[j] })
	return dirty, unknown, nil
}

// lookupMax reads the highest offset at or after the committed one that
// the table holds for each partition of unknown, into dirty and into the
// partition's state (unless it changed meanwhile).
func (w *Writer) lookupMax(ctx context.Context, t *table, dirty map[int32]*dirtyPart, unknown []int32) error {
	// The first lookup of a dirty spell: rows of an INSERT still running,
	// another instance's included, would land after the answer.
	if err := w.awaitInserts(ctx, t, unknown); err != nil {
		return err
	}
	conds := make([]string, len(unknown))
	for i, p := range unknown {
		c := dirty[p].committed
		conds[i] = fmt.Sprintf("(kafka_partition = %d AND intDiv(kafka_offset, %d) >= %d AND kafka_offset >= %d)", p, resumeChunk, c/resumeChunk, c)
	}
	maxes, err := w.lookupRows(ctx, t, "max(kafka_offset)", conds, true)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range unknown {
		d := dirty[p]
		m := int64(-1)
		for off := range maxes[p] {
			m = off
		}
		d.max, d.maxKnown = m, true
		if cur := w.parts[tp{t.topic, p}]; cur == d.ps && cur.dirty && !cur.maxKnown {
			cur.maxKnown, cur.presentMax = true, m
		}
	}
	return nil
}

// presentConds returns the conditions of the lookup of the rows' offsets
// that may be in the table: per dirty partition of the rows, those from
// its committed offset up to its highest present one.
func presentConds(spans map[int32][2]int64, dirty map[int32]*dirtyPart) []string {
	var conds []string
	for _, p := range sortedKeys(dirty) {
		d := dirty[p]
		if _, ok := spans[p]; !ok {
			continue // looked up for its max only
		}
		lo, hi := d.lo, d.hi
		if lo < d.committed {
			lo = d.committed
		}
		if hi > d.max {
			hi = d.max
		}
		if lo > hi {
			continue
		}
		conds = append(conds, fmt.Sprintf("(kafka_partition = %d AND intDiv(kafka_offset, %d) BETWEEN %d AND %d AND kafka_offset BETWEEN %d AND %d)",
			p, resumeChunk, lo/resumeChunk, hi/resumeChunk, lo, hi))
	}
	return conds
}

func sortedKeys[V any](m map[int32]V) []int32 {
	out := make([]int32, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// offsets is a lookup's answer: per partition, offsets (or one max).
type offsets map[int32]map[int64]struct{}

func (o offsets) has(p int32, off int64) bool {
	_, ok := o[p][off]
	return ok
}

// lookup runs a resume query over the OR of conds. With agg (a max), each
// partition's set holds the one aggregate value.
func (w *Writer) lookup(ctx context.Context, t *table, what string, conds []string, agg bool) (offsets, error) {
	// Rows of an INSERT still running would land after the answer.
	if err := w.awaitSettled(ctx); err != nil {
		return nil, err
	}
	q := "SELECT kafka_partition, " + what + " FROM " + w.cfg.Database + "." + t.name +
		" WHERE kafka_topic = " + quote(t.topic) + " AND (" + strings.Join(conds, " OR ") + ")"
	if agg {
		q += " GROUP BY kafka_partition"
	}
	start := time.Now()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	rows, err := w.getConn().Query(qctx, q)
	if err != nil {
		return nil, fmt.Errorf("sink: resume lookup in %s: %w", t.name, err)
	}
	defer rows.Close()
	out := offsets{}
	for rows.Next() {
		var p int32
		var off int64
		if err := rows.Scan(&p, &off); err != nil {
			return nil, fmt.Errorf("sink: resume lookup in %s: %w", t.name, err)
		}
		if out[p] == nil {
			out[p] = map[int64]struct{}{}
		}
		out[p][off] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sink: resume lookup in %s: %w", t.name, err)
	}
	w.m.lookupSeconds.WithLabelValues(t.name).Observe(time.Since(start).Seconds())
	return out, nil
}

// lookupRows is lookup for the resume rule. A record of the rejected topic
// is a row of usage_rejected or of usage_quarantine, never both: for
// usage_rejected it looks in both tables, so that a record quarantined
// before a crash (ClickHouse refused it then) is not inserted into
// usage_rejected on the replay (ClickHouse may take it now).
func (w *Writer) lookupRows(ctx context.Context, t *table, what string, conds []string, agg bool) (offsets, error) {
	out, err := w.lookup(ctx, t, what, conds, agg)
	if err != nil || !t.rejected {
		return out, err
	}
	q, err := w.lookup(ctx, w.quarantine, what, conds, agg)
	if err != nil {
		return nil, err
	}
	for p, offs := range q {
		if out[p] == nil {
			out[p] = map[int64]struct{}{}
		}
		for off := range offs {
			if agg {
				for cur := range out[p] {
					if cur >= off {
						off = cur
					}
				}
				clear(out[p])
			}
			out[p][off] = struct{}{}
		}
	}
	return out, nil
}

// quote is a ClickHouse string literal.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func spansOf(rows []*row) map[int32][2]int64 {
	out := map[int32][2]int64{}
	for _, r := range rows {
		s, ok := out[r.partition()]
		if !ok {
			s = [2]int64{r.offset(), r.offset()}
		}
		s[0], s[1] = min(s[0], r.offset()), max(s[1], r.offset())
		out[r.partition()] = s
	}
	return out
}
