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
// Worker has work and that has a committed offset to fence it with; ok is
// false if there is none.
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
		if _, fenced := committed[p]; !fenced {
			continue // nothing to fence its chunks with yet: wait for input
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

// fence returns ctx for ending the open transaction: its TxnOffsetCommit
// carries, for every partition the transaction wrote for (state or outputs:
// it consumed the partition's input, or a punctuation had an effect) or did
// Work of, the partition's offset of every input topic, the one committed
// before for a topic of which it consumed no input. So the group generation
// fences every transaction of a zombie, one that only punctuated an idle
// partition (dedup's ticks and metadata) or did a chunk of work included,
// as it fences one that consumed input (DESIGN §3, §6): a transaction
// without an offset is not checked against the group, and a member that
// has not heard yet that the group moved on would commit state and outputs
// of a partition another member owns now. A partition punctuated without
// an effect needs no fence (the aggregator punctuates every partition, and
// most of its punctuations do nothing). A topic with no committed offset
// yet is left out; a transaction with none at all (its partitions never
// had input committed) is not fenced, which is why Work waits for one. The
// offsets are read here, not in the hook, which runs under kgo's
// transaction lock.
func (rt *Runtime) fence(ctx context.Context) context.Context {
	all := rt.sess.Client().CommittedOffsets()
	type fence struct {
		topic string
		p     int32
		eo    kgo.EpochOffset
	}
	var fences []fence
	for _, p := range sortedPartitions(rt.ovs) {
		if ov := rt.ovs[p]; !ov.touched && len(ov.out) == 0 && p != rt.txWorked {
			continue
		}
		for _, topic := range rt.cfg.inputs() {
			if eo, ok := all[topic][p]; ok {
				fences = append(fences, fence{topic, p, eo})
			}
		}
	}
	if len(fences) == 0 {
		return ctx
	}
	return kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		for _, f := range fences {
			addFence(req, f.topic, f.p, f.eo)
		}
		return nil
	})
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
