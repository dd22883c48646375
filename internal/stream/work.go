package stream

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// How the run loop gives a Worker (processor.go) its turns and fences its
// chunks.

// noWorker is txWorked when no partition worked in the open transaction.
const noWorker = -1

// nextWorker returns the next partition, in turn from workNext, whose
// Worker has work and that has an offset committed; ok is false if there
// is none. A partition the group had no committed offset of when it was
// assigned gets its first Work once one of its transactions committed an
// offset: its first that consumed input, or one that committed the offset
// its reading starts from (fenceFirst). Any transaction for it is fenced
// before that too (fence); the wait keeps the partition's first
// transaction, whose input decides its first work, free of chunks: it
// commits at the commit interval, as one without work does
// (TestFinalAfterAbortedTransaction has a rebalance abort it).
func (rt *Runtime) nextWorker() (p int32, a *activePart, w Worker, ok bool) {
	some := false // the common case, after every poll: nobody has work
	for _, a := range rt.active {
		if w, isWorker := a.part.(Worker); isWorker && w.HasWork() {
			some = true
			break
		}
	}
	if !some {
		return 0, nil, nil, false
	}
	var committed map[int32]kgo.EpochOffset
	read := false
	ps := sortedPartitions(rt.active)
	first := 0
	for first < len(ps) && ps[first] < rt.workNext {
		first++
	}
	for i := range ps {
		p := ps[(first+i)%len(ps)]
		a := rt.active[p]
		w, isWorker := a.part.(Worker)
		if !isWorker || !w.HasWork() {
			continue
		}
		if !read {
			committed, read = rt.sess.Client().CommittedOffsets()[rt.cfg.InputTopic], true
		}
		if _, ok := committed[p]; !ok && !a.startCommitted {
			continue // no transaction of it committed yet: wait for one
		}
		return p, a, w, true
	}
	return 0, nil, nil, false
}

// pendingWork reports whether a partition has work that work would do.
func (rt *Runtime) pendingWork() bool {
	_, _, _, ok := rt.nextWorker()
	return ok
}

// work gives the next partition with work, in turn, one call of Work in the
// open transaction (begun if need be). It does nothing if a partition
// already worked in this transaction, or the transaction will abort.
func (rt *Runtime) work() error {
	if rt.txWorked != noWorker || rt.mustAbort {
		return nil
	}
	p, a, w, ok := rt.nextWorker()
	if !ok {
		return nil
	}
	if !rt.inTxn {
		if err := rt.begin(); err != nil {
			return err
		}
	}
	rt.txWorked, rt.workNext = p, p+1
	if err := w.Work(&Tx{rt: rt, p: p, ov: rt.overlayFor(p, a.epoch)}); err != nil {
		return fmt.Errorf("stream: work of partition %d: %w", p, err)
	}
	return nil
}

// fenced reports whether the open transaction must be fenced for
// partition p, whose overlay is ov: it writes state or outputs for it (it
// consumed its input, or a punctuation had an effect), or did its Work.
func (rt *Runtime) fenced(p int32, ov *overlay) bool {
	return ov.touched || len(ov.out) > 0 || p == rt.txWorked
}

// fenceFirst runs before the open transaction's changelog is produced. For
// each partition it is fenced for, it records, for each input topic the
// group had no committed offset of at the partition's assignment and that
// has none yet, the offset the partition's reading of it starts from
// (activePart.start) as the topic's next input offset, as if the
// transaction had consumed up to there: the state and the changelog carry
// it, and fence commits it. A topic whose input the transaction consumed
// keeps the offset after its records. So the partition's first
// transaction commits an offset of every input topic, which every later
// transaction for it fences with, and the restore's check of the state's
// offset against the group's holds.
func (rt *Runtime) fenceFirst() {
	var committed map[string]map[int32]kgo.EpochOffset
	read := false
	for _, p := range sortedPartitions(rt.ovs) {
		ov := rt.ovs[p]
		a, ok := rt.active[p]
		if !ok || a.epoch != rt.txEpoch[p] || len(a.start) == 0 || a.startCommitted || !rt.fenced(p, ov) {
			continue
		}
		if !read {
			committed, read = rt.sess.Client().CommittedOffsets(), true
		}
		for _, topic := range rt.cfg.inputs() {
			start, fromStart := a.start[topic]
			k := rt.cfg.inputOffsetKey(topic)
			if _, consumed := ov.inputNext[k]; !fromStart || consumed {
				continue
			}
			if _, ok := committed[topic][p]; ok {
				continue
			}
			if ov.inputNext == nil {
				ov.inputNext = map[string]int64{}
			}
			ov.inputNext[k] = start
			ov.touched = true
			ov.startFenced = true
		}
	}
}

// fence returns ctx for ending the open transaction: its TxnOffsetCommit
// carries, for every partition the transaction is fenced for (fenced), the
// partition's offset of every input topic: the new one of a topic it
// consumed input of, the one committed before for any other. So the group
// generation fences every transaction of a zombie, one that only
// punctuated an idle partition (dedup's ticks and metadata) or did a chunk
// of work included, as it fences one that consumed input (docs/design.md,
// Exactly-once, 7): a transaction without an offset is not checked against
// the group, and a member that has not heard yet that the group moved on
// would commit state and outputs of a partition another member owns now. A
// partition punctuated without an effect needs no fence (the aggregator
// punctuates every partition, and most of its punctuations do nothing). A
// topic the group had no committed offset of when the partition was
// assigned has one from the partition's first transaction on: that
// transaction commits the offset the partition's reading starts from
// (fenceFirst), and later ones fence with it (activePart.start: kgo's
// committed offsets do not show an offset it did not consume). The offsets
// are read here, not in the hook, which runs under kgo's transaction lock.
//
// kgo's request carries a partition of a topic only where the
// transaction consumed records of it: kgo also puts in its own position
// where that differs from what it last saw committed, and a start offset
// committed here moves what kgo saw committed under a position it kept
// from an aborted transaction (the first record it polled, past the start
// when aborted transactions or control records open the log). Committed,
// that position would differ from the state's offset
// (TestStartOffsetAfterAbortedFirstRead).
func (rt *Runtime) fence(ctx context.Context) context.Context {
	all := rt.sess.Client().CommittedOffsets()
	var fences []fence
	consumed := map[string]map[int32]bool{}
	// A partition that skipped a batch commits the state's next input
	// offset of its topic (oversized.go), whatever kgo's position says.
	skipped := rt.skippedFences()
	for _, f := range skipped {
		if consumed[f.topic] == nil {
			consumed[f.topic] = map[int32]bool{}
		}
		consumed[f.topic][f.p] = true
	}
	for _, p := range sortedPartitions(rt.ovs) {
		ov := rt.ovs[p]
		for _, c := range ov.in {
			if c.n > 0 {
				if consumed[c.topic] == nil {
					consumed[c.topic] = map[int32]bool{}
				}
				consumed[c.topic][p] = true
			}
		}
		if !rt.fenced(p, ov) {
			continue
		}
		a := rt.active[p]
		for _, topic := range rt.cfg.inputs() {
			if eo, ok := all[topic][p]; ok {
				fences = append(fences, fence{topic, p, eo})
				continue
			}
			// A topic it consumed is in the request already (addFence
			// keeps that one); otherwise this is the start offset
			// fenceFirst recorded in this transaction.
			if o, ok := ov.inputNext[rt.cfg.inputOffsetKey(topic)]; ok {
				fences = append(fences, fence{topic, p, kgo.EpochOffset{Epoch: -1, Offset: o}})
				continue
			}
			if a != nil && a.epoch == rt.txEpoch[p] && a.startCommitted {
				if o, ok := a.start[topic]; ok {
					fences = append(fences, fence{topic, p, kgo.EpochOffset{Epoch: -1, Offset: o}})
				}
			}
		}
	}
	return kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		keepConsumed(req, consumed)
		for _, f := range fences {
			addFence(req, f.topic, f.p, f.eo)
		}
		for _, f := range skipped {
			setFence(req, f.topic, f.p, f.eo)
		}
		return nil
	})
}

// keepConsumed drops from req every partition of a topic that consumed
// does not name it under.
func keepConsumed(req *kmsg.TxnOffsetCommitRequest, consumed map[string]map[int32]bool) {
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		ps := t.Partitions[:0]
		for _, rp := range t.Partitions {
			if consumed[t.Topic][rp.Partition] {
				ps = append(ps, rp)
			}
		}
		if t.Partitions = ps; len(ps) > 0 {
			topics = append(topics, t)
		}
	}
	req.Topics = topics
}

// addFence adds partition p of topic at eo to req, unless req commits it
// already (the transaction consumed its input: its new offset is there).
func addFence(req *kmsg.TxnOffsetCommitRequest, topic string, p int32, eo kgo.EpochOffset) {
	ti := -1
	for i := range req.Topics {
		if req.Topics[i].Topic != topic {
			continue
		}
		ti = i
		for _, rp := range req.Topics[i].Partitions {
			if rp.Partition == p {
				return
			}
		}
	}
	if ti < 0 {
		t := kmsg.NewTxnOffsetCommitRequestTopic()
		t.Topic = topic
		req.Topics = append(req.Topics, t)
		ti = len(req.Topics) - 1
	}
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition = p
	rp.Offset = eo.Offset
	rp.LeaderEpoch = eo.Epoch
	rp.Metadata = &req.MemberID
	req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, rp)
}
