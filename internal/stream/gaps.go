package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/session"
)

// Kafka stores an uncompressed batch's records as a producer wrote them,
// offset deltas included (4.3 checks a compressed batch's, not an
// uncompressed one's), and the Kafka client takes a record's offset for
// its batch's base plus its delta: a record whose delta points past its
// batch is returned at that offset, and the client then drops every
// record it reads below the offset after it, other producers' batches
// included, as if it had consumed them; at the end of the log it asks for
// an offset past the log's end and the partition stops with
// OFFSET_OUT_OF_RANGE. A delta that goes back, or repeats, drops the
// batch's own records the same way, and an uncompressed record the client
// cannot read ends its batch there. The stage never sees a batch's bytes
// (kgo decodes an uncompressed batch without its Decompressor), but it
// sees what each of those leaves behind: offsets of its input it was
// given no record of, between the input offset it has consumed up to and
// the next record it is given.
//
// Such gaps are also routine: a transactional producer's commit markers
// and aborted transactions, and records deleted by retention. So with
// Config.VerifyInputGaps, every gap of InputTopic is checked against the
// log (verifyGap): the batches that hold its offsets are fetched from the
// partition's leader as the broker stores them, and each uncompressed
// data batch among them must have records the client reads, with offset
// deltas that rise and stay within the batch. A batch that does not is
// rejected and skipped as a batch past the decompression bound is
// (oversized.go): rejected in the open transaction, the poll's records of
// the partition cut where the gap ends (the client read them at offsets
// that are not theirs, or past records it dropped), and the input moved
// to the batch's end, so that the next session fetches the dropped
// records again. A gap whose batches are all sound is left as it is: the
// client skipped it for a reason of its own. A fetch of the gap that
// fails aborts the transaction, which puts the partition back at its
// committed offset: the gap is polled, and checked, again.
//
// A malformed batch in a transaction that aborted leaves no record after
// it when its delta points past the end of the log (the client keeps no
// record of an aborted transaction, but takes their offsets): the client
// asks next for an offset past the log's end, OFFSET_OUT_OF_RANGE, and
// that partition's log is checked from the offset expected to its end
// (takeOutOfRange); the error stops the stage only if no malformed batch
// explains it. And a gap whose first offsets retention deleted while it
// was checked, but not its end, cannot be judged: the partition skips the
// deleted offsets and reads the rest again from the log start, without a
// rejection (verify).

// The results of a gap's check (meterline_stream_input_gaps_checked_total).
const (
	gapSound     = "sound"
	gapDeleted   = "deleted"
	gapMalformed = "malformed"
	gapError     = "error"
)

var gapResults = []string{gapSound, gapDeleted, gapMalformed, gapError}

// gapFetchBytes is what one fetch of a gap's batches asks for: a batch
// larger than it comes whole (KIP-74), the rest in later fetches.
const gapFetchBytes = 1 << 20

// gapFetchTimeout bounds one fetch of a gap's batches.
const gapFetchTimeout = 10 * time.Second

// partGaps is what checkGaps knows of one partition of the input.
type partGaps struct {
	p     int32
	next  int64 // the next offset expected; -1: unknown
	fetch []*kgo.FetchPartition
	tl    *kgo.ErrDecompressTooLarge // its batch past the bound; nil: none
	oor   error                      // kgo's OFFSET_OUT_OF_RANGE of it; nil: none
	bad   *RejectedBatch             // the malformed batch found, or (reread) the gap to read again
	err   error                      // why its gaps could not be checked
	// reread: retention deleted the first offsets of a gap (bad.From)
	// while it was checked, and not the rest, which the partition reads
	// again from bad.Next (verify).
	reread bool
}

// hasGap reports whether the poll skipped offsets of the partition.
func (pg *partGaps) hasGap() bool {
	next := pg.next
	for _, fp := range pg.fetch {
		for _, r := range fp.Records {
			if next >= 0 && r.Offset > next {
				return true
			}
			next = r.Offset + 1
		}
	}
	return pg.oor != nil || pg.tl != nil && next >= 0 && pg.tl.Offset > next
}

// takeOutOfRange returns, when Config.VerifyInputGaps is set, the poll's
// OFFSET_OUT_OF_RANGE errors of InputTopic's partitions, and clears them
// from fs. A malformed batch in a transaction that aborted leaves no
// record after it: the Kafka client keeps none of an aborted
// transaction's records, but takes their offsets all the same, so a
// delta that points past the end of the log drops every record after it
// and has the client ask next for an offset past the log's end. checkGaps
// checks such a partition's log from its expected offset to the end, and
// the error stops the stage only if nothing there explains it.
func (rt *Runtime) takeOutOfRange(fs kgo.Fetches) map[int32]error {
	if !rt.cfg.VerifyInputGaps {
		return nil
	}
	var out map[int32]error
	for i := range fs {
		for ti := range fs[i].Topics {
			if fs[i].Topics[ti].Topic != rt.cfg.InputTopic {
				continue
			}
			ps := fs[i].Topics[ti].Partitions
			for pi := range ps {
				if ps[pi].Err != nil && errors.Is(ps[pi].Err, kerr.OffsetOutOfRange) {
					if out == nil {
						out = map[int32]error{}
					}
					out[ps[pi].Partition] = ps[pi].Err
					ps[pi].Err = nil
				}
			}
		}
	}
	return out
}

// checkGaps checks the gaps of InputTopic in fs and in the batches past
// the bound of the poll (tooLarge), and the log after a partition kgo
// found out of range (outOfRange, takeOutOfRange), partition by
// partition, when Config.VerifyInputGaps is set. It returns the batches to
// reject as malformed, and tooLarge without those of a partition whose
// records it cut there. A partition whose gap could not be checked loses
// its records of this poll and marks the transaction for an abort; one out
// of range that no malformed batch explains stops the stage, as any such
// fetch error does (session.FetchError).
func (rt *Runtime) checkGaps(ctx context.Context, fs kgo.Fetches, tooLarge []*kgo.ErrDecompressTooLarge, outOfRange map[int32]error) (forged, reread []RejectedBatch, _ []*kgo.ErrDecompressTooLarge, _ error) {
	if !rt.cfg.VerifyInputGaps {
		return nil, nil, tooLarge, nil
	}
	topic := rt.cfg.InputTopic
	parts := map[int32]*partGaps{}
	var gaps []*partGaps
	part := func(p int32) *partGaps {
		pg, ok := parts[p]
		if !ok {
			pg = &partGaps{p: p}
			parts[p] = pg
		}
		return pg
	}
	for i := range fs {
		for ti := range fs[i].Topics {
			if fs[i].Topics[ti].Topic != topic {
				continue
			}
			for pi := range fs[i].Topics[ti].Partitions {
				if fp := &fs[i].Topics[ti].Partitions[pi]; len(fp.Records) > 0 {
					pg := part(fp.Partition)
					pg.fetch = append(pg.fetch, fp)
				}
			}
		}
	}
	for _, tl := range tooLarge {
		if tl.Topic == topic {
			part(tl.Partition).tl = tl
		}
	}
	for p, err := range outOfRange {
		part(p).oor = err
	}
	for _, p := range sortedPartitions(parts) {
		pg := parts[p]
		next, known, err := rt.expectedInput(topic, p)
		if err != nil {
			return nil, nil, nil, err
		}
		if pg.next = -1; known {
			pg.next = next
		}
		if pg.hasGap() {
			gaps = append(gaps, pg)
		}
	}
	if len(gaps) == 0 {
		return nil, nil, tooLarge, nil
	}
	if err := rt.gapCheckReady(ctx, topic); err != nil {
		for _, pg := range gaps {
			pg.err = err
		}
	} else {
		// The partitions' gaps are checked at once (parallel), each
		// reading only its own records and the poll's shared state.
		_ = parallel(len(gaps), func(i int) error {
			pg := gaps[i]
			pg.bad, pg.reread, pg.err = rt.walkGaps(ctx, topic, pg)
			return nil
		})
	}
	cut := map[int32]bool{}
	for _, pg := range gaps {
		switch {
		case pg.err != nil:
			if errors.Is(pg.err, kerr.UnknownTopicID) {
				delete(rt.topicIDs, topic) // recreated: read it again
			}
			rt.log.Warn("an input gap could not be checked: aborting the transaction, to poll it again", zap.String("topic", topic),
				zap.Int32("partition", pg.p), zap.Error(pg.err))
			for _, fp := range pg.fetch {
				fp.Records = nil
			}
			cut[pg.p] = true
			rt.mustAbort = true
		case pg.bad != nil && pg.reread:
			reread = append(reread, *pg.bad)
			cut[pg.p] = true
		case pg.bad != nil:
			forged = append(forged, *pg.bad)
			cut[pg.p] = true
		case pg.oor != nil:
			return nil, nil, nil, fmt.Errorf("stream: %w", session.FetchError(rt.log, rt.cfg.Kafka.Principal(), rt.cfg.Group, kgo.Fetches{{Topics: []kgo.FetchTopic{{
				Topic: topic, Partitions: []kgo.FetchPartition{{Partition: pg.p, Err: pg.oor}}}}}}))
		}
	}
	kept := tooLarge[:0:0]
	for _, t := range tooLarge {
		if t.Topic != topic || !cut[t.Partition] {
			kept = append(kept, t)
		}
	}
	return forged, reread, kept, nil
}

// gapCheckReady makes the client that fetches gaps (gapClient) and reads
// topic's ID, once.
func (rt *Runtime) gapCheckReady(ctx context.Context, topic string) error {
	if rt.gapClient == nil {
		cl, err := rt.newClient()
		if err != nil {
			return fmt.Errorf("a client to check the input's gaps: %w", err)
		}
		rt.gapClient = cl
	}
	ctx, cancel := context.WithTimeout(ctx, gapFetchTimeout)
	defer cancel()
	_, err := rt.topicID(ctx, rt.gapClient, topic)
	return err
}

// walkGaps checks the gaps of partition pg of topic before each of its
// records in the poll's fetches, before its batch past the bound, and,
// when kgo found it out of range, from after them to the end of the log,
// pg.next being the offset expected first (-1: unknown, the first gap is
// not checked). At a malformed batch it cuts the records from the gap's
// end on, and returns the batch to reject; at a gap whose first offsets
// retention deleted meanwhile, the gap, to read again (reread, verify).
func (rt *Runtime) walkGaps(ctx context.Context, topic string, pg *partGaps) (bad *RejectedBatch, reread bool, err error) {
	w := &gapWalk{rt: rt, topic: topic, p: pg.p}
	next, fetch, tl := pg.next, pg.fetch, pg.tl
	for fi, fp := range fetch {
		for i, r := range fp.Records {
			if next >= 0 && r.Offset > next {
				bad, reread, err := w.check(ctx, next, r.Offset)
				if err != nil {
					return nil, false, err
				}
				if bad != nil {
					fp.Records = fp.Records[:i]
					for _, later := range fetch[fi+1:] {
						later.Records = nil
					}
					return bad, reread, nil
				}
			}
			next = r.Offset + 1
		}
	}
	if tl != nil && next >= 0 && tl.Offset > next {
		if bad, reread, err := w.check(ctx, next, tl.Offset); bad != nil || err != nil {
			return bad, reread, err
		}
	}
	if tl != nil {
		next = tl.NextOffset
	}
	if pg.oor != nil && next >= 0 {
		return w.checkToEnd(ctx, next)
	}
	return nil, false, nil
}

// checkToEnd checks the partition's batches from offset from to the end
// of its log (its last stable offset), for a partition kgo found out of
// range (takeOutOfRange). Out of range for this fetch too (retention
// deleted offsets the stage had not read), it finds nothing.
func (w *gapWalk) checkToEnd(ctx context.Context, from int64) (*RejectedBatch, bool, error) {
	raw, _, end, err := w.rt.rawFetch(ctx, w.topic, w.p, from)
	if errors.Is(err, kerr.OffsetOutOfRange) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("fetch offsets %d to the end: %w", from, err)
	}
	if end <= from {
		return nil, false, nil
	}
	w.raw, w.from = raw, from
	return w.check(ctx, from, end)
}

// gapWalk checks the gaps of one partition of a poll, in offset order,
// reading each fetch's batches for as many gaps as they hold, each once:
// the fetches a poll's gaps cost, and the batches read, are in proportion
// to the bytes they span, not to how many there are (a transactional
// producer can leave one a record).
type gapWalk struct {
	rt    *Runtime
	topic string
	p     int32
	raw   []byte // the last fetch's batches
	from  int64  // the offset it fetched from
}

// check is verify, counted by its result; reread says that bad is not a
// malformed batch but a gap to read again.
func (w *gapWalk) check(ctx context.Context, from, to int64) (bad *RejectedBatch, reread bool, err error) {
	bad, deleted, err := w.verify(ctx, from, to)
	result := gapSound
	switch {
	case err != nil:
		result = gapError
	case deleted:
		result = gapDeleted
	case bad != nil:
		result = gapMalformed
	}
	if w.rt.m != nil {
		w.rt.m.gapsChecked.WithLabelValues(result).Inc()
	}
	return bad, deleted && bad != nil, err
}

// expectedInput is the offset of topic that partition p's next record
// should have: the open transaction's next input offset, else the state's,
// else where its reading started; known is false when there is none.
func (rt *Runtime) expectedInput(topic string, p int32) (next int64, known bool, err error) {
	a, ok := rt.active[p]
	if !ok {
		return 0, false, nil
	}
	k := rt.cfg.inputOffsetKey(topic)
	if ov, ok := rt.ovs[p]; ok && rt.txEpoch[p] == a.epoch {
		if o, ok := ov.inputNext[k]; ok {
			return o, true, nil
		}
	}
	v, ok, err := rt.store.Get(p, []byte(k))
	if err != nil {
		return 0, false, fmt.Errorf("stream: partition %d of %s: input offset: %w", p, topic, err)
	}
	if ok {
		o, err := decodeOffset(v)
		if err != nil {
			return 0, false, fmt.Errorf("stream: partition %d of %s: input offset: %w", p, topic, err)
		}
		return o, true, nil
	}
	if o, ok := a.start[topic]; ok {
		return o, true, nil
	}
	return 0, false, nil
}

// verify checks the batches that hold offsets from to to-1 of the
// partition, which the client returned no record of: it returns the first
// malformed one as a batch to reject from from (or its first offset) to
// its end, nil if they are all sound, or were deleted meanwhile (deleted).
// If retention deleted only the first of them, and not the offset to,
// whose record the client returned, what made the client skip the rest
// (a malformed batch among those deleted) cannot be read: it returns,
// deleted, the gap up to the log start, as a batch for the partition to
// skip (bad.Next the log start) and read again after it, without a
// rejection. The batches of the last fetch are read first when they start
// at or before from.
func (w *gapWalk) verify(ctx context.Context, from, to int64) (bad *RejectedBatch, deleted bool, err error) {
	w.rt.log.Debug("checking an input gap", zap.String("topic", w.topic), zap.Int32("partition", w.p), zap.Int64("from", from), zap.Int64("to", to))
	at := from
	for at < to {
		fetched := false
		if w.raw == nil || at < w.from {
			raw, logStart, _, err := w.rt.rawFetch(ctx, w.topic, w.p, at)
			if errors.Is(err, kerr.OffsetOutOfRange) {
				if logStart > at && logStart <= to {
					return &RejectedBatch{Topic: w.topic, Partition: w.p, From: from, Next: logStart}, true, nil
				}
				return nil, true, nil // nothing of it can be read
			}
			if err != nil {
				return nil, false, fmt.Errorf("fetch offsets %d to %d: %w", at, to-1, err)
			}
			w.raw, w.from, fetched = raw, at, true
		}
		n, rest, bad := checkGapBatches(w.raw, at, to)
		if bad != nil {
			bad.Topic, bad.Partition = w.topic, w.p
			bad.From = max(bad.From, from)
			return bad, false, nil
		}
		// The batches before rest end before n: no later gap of the
		// walk holds an offset of theirs, and none reads them again.
		w.raw = rest
		if n <= at {
			if fetched {
				return nil, false, fmt.Errorf("fetch offsets %d to %d: no whole batch at %d", at, to-1, at)
			}
			w.raw = nil // read to its end: fetch from at
			continue
		}
		at = n
	}
	return nil, false, nil
}

// checkGapBatches walks raw, the record batches of a fetch from offset at,
// up to the batch at or past to: it returns the first malformed one that
// holds an offset from at on (its From its first offset, Next the one
// after its last), else the offset after the last batch it read whole,
// and rest, raw from the batch it stopped at (every batch before it ends
// before that offset), so that a walk of a poll's gaps, in offset order,
// reads each batch of a fetch once, not once a gap.
func checkGapBatches(raw []byte, at, to int64) (next int64, rest []byte, bad *RejectedBatch) {
	next = at
	for len(raw) > 17 {
		base := int64(binary.BigEndian.Uint64(raw))
		length := int64(int32(binary.BigEndian.Uint32(raw[8:]))) + 12
		if length < 12 || int64(len(raw)) < length {
			break // the fetch's last batch, cut
		}
		rest = raw
		one := raw[:length]
		raw = raw[length:]
		if base >= to {
			return to, rest, nil
		}
		if one[16] != 2 {
			// A message set of before Kafka 0.11 (no broker of Kafka 4
			// writes one): its offset is its last.
			next = max(next, base+1)
			continue
		}
		var b kmsg.RecordBatch
		if err := b.ReadFrom(one); err != nil {
			return next, rest, nil
		}
		last := b.FirstOffset + int64(b.LastOffsetDelta)
		if last < next {
			continue
		}
		if problem := batchProblem(&b); problem != "" {
			return 0, nil, &RejectedBatch{From: b.FirstOffset, Next: max(last, b.FirstOffset) + 1, Malformed: problem}
		}
		next = last + 1
		if next >= to {
			return next, rest, nil
		}
	}
	return next, raw, nil
}

// batchProblem says what is wrong with b for the Kafka client ("" if
// nothing): an uncompressed data batch's records must decode as kgo reads
// them, and their offset deltas rise and stay within the batch. A control
// batch is written by the broker; a compressed batch's deltas are checked
// by the broker, and its records by the stage's decompressor
// (decompress.go).
func batchProblem(b *kmsg.RecordBatch) string {
	if b.Attributes&0x20 != 0 || b.Attributes&0x07 != 0 {
		return ""
	}
	if b.NumRecords < 0 {
		return fmt.Sprintf("record count %d", b.NumRecords)
	}
	in := b.Records
	prev := int64(-1)
	for i := range int(min(b.NumRecords, int32(len(in)+1))) {
		delta, n, ok := kgoRecord(in)
		if !ok {
			return fmt.Sprintf("record %d of %d does not decode", i, b.NumRecords)
		}
		if delta <= prev || delta > int64(b.LastOffsetDelta) {
			return fmt.Sprintf("record %d has offset delta %d (the batch's deltas run from 0 to %d)", i, delta, b.LastOffsetDelta)
		}
		prev = delta
		in = in[n:]
	}
	return ""
}

// rawFetch fetches partition p of topic from offset at, read_committed,
// from the partition's leader: its record batches as the broker stores
// them, the partition's log start offset (-1: not known) and its end, the
// last stable offset.
func (rt *Runtime) rawFetch(ctx context.Context, topic string, p int32, at int64) (raw []byte, logStart, end int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, gapFetchTimeout)
	defer cancel()
	cl := rt.sess.Client()
	leader, epoch, err := cl.PartitionLeader(topic, p)
	if err != nil {
		return nil, -1, -1, err
	}
	if leader < 0 {
		return nil, -1, -1, errors.New("no leader known")
	}
	id, ok := rt.topicIDs[topic]
	if !ok {
		return nil, -1, -1, errors.New("the topic's ID is not known")
	}
	req := kmsg.NewPtrFetchRequest()
	req.MaxBytes, req.IsolationLevel = gapFetchBytes, 1
	rtp := kmsg.NewFetchRequestTopic()
	rtp.Topic, rtp.TopicID = topic, id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.CurrentLeaderEpoch, rp.PartitionMaxBytes = p, at, epoch, gapFetchBytes
	rtp.Partitions = append(rtp.Partitions, rp)
	req.Topics = append(req.Topics, rtp)
	kresp, err := rt.gapClient.Broker(int(leader)).Request(ctx, req)
	if err != nil {
		return nil, -1, -1, err
	}
	resp := kresp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, -1, -1, err
	}
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			if rp.Partition != p || (t.Topic != topic && t.TopicID != id) {
				continue
			}
			return rp.RecordBatches, rp.LogStartOffset, rp.LastStableOffset, kerr.ErrorForCode(rp.ErrorCode)
		}
	}
	return nil, -1, -1, errors.New("the response has no such partition")
}

// addReread adds each gap of reread to its partition's job, after the
// records polled before it: the partition skips it, without a rejection,
// and reads the input again from its Next (skipBatch).
func (rt *Runtime) addReread(jobs *fetchJobs, reread []RejectedBatch) error {
	for _, rb := range reread {
		j, err := rt.jobFor(jobs, rb.Topic, rb.Partition)
		if err != nil {
			return err
		}
		if j != nil {
			j.batches = append(j.batches, fetchBatch{topic: rb.Topic, rejected: &rb, reread: true})
		}
	}
	return nil
}

// topicID is topic's ID, as the brokers' metadata says, cached.
func (rt *Runtime) topicID(ctx context.Context, cl *kgo.Client, topic string) ([16]byte, error) {
	if id, ok := rt.topicIDs[topic]; ok {
		return id, nil
	}
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return [16]byte{}, err
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		return [16]byte{}, fmt.Errorf("topic %s: %v", topic, d.Err)
	}
	if rt.topicIDs == nil {
		rt.topicIDs = map[string][16]byte{}
	}
	rt.topicIDs[topic] = d.ID
	return d.ID, nil
}
