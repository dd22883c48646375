package stream

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// A batch of the input that decompresses past Config.MaxDecompressBatchBytes
// is bad input (docs/design.md, Bad input): kgo stops fetching its partition
// and reports kgo.ErrDecompressTooLarge, which would stop the stage on every
// restart and on every member the partition moves to. The runtime instead
// hands the batch to the partition (BatchRejecter), which rejects it in the
// open transaction, and moves the partition's input past it in the same
// transaction: the state's input offset, the offset the transaction commits
// (fence) and the client's position (SetOffsets). The skip commits with the
// rejection, or neither does: a transaction that does not commit puts the
// client back where the committed state says (rewindSkipped), so the batch
// is fetched, and rejected, again.
//
// kgo's SetOffsets drops every buffered fetch of the client, and a dropped
// fetch that held another partition's batch past the bound leaves that
// partition stopped for good, its error never returned (franz-go v1.22.3:
// the stopped cursor is re-enabled only by SetOffsets of that partition,
// and not by one to the offset it is already at). So a transaction that
// skipped a batch ends its session (skipRebuild): the next one, on a new
// client, fetches every partition from its committed offset, and a batch
// past the bound whose error was dropped is fetched, and rejected, then.

// takeTooLarge returns the poll's errors that name a batch past the
// decompression bound, and clears them from fs, so that session.FetchError
// sees the others only.
func takeTooLarge(fs kgo.Fetches) []*kgo.ErrDecompressTooLarge {
	var out []*kgo.ErrDecompressTooLarge
	for i := range fs {
		for ti := range fs[i].Topics {
			ps := fs[i].Topics[ti].Partitions
			for pi := range ps {
				var tl *kgo.ErrDecompressTooLarge
				if ps[pi].Err != nil && errors.As(ps[pi].Err, &tl) {
					out = append(out, tl)
					ps[pi].Err = nil
				}
			}
		}
	}
	return out
}

// addTooLarge adds each batch past the bound to its partition's job, after
// the records polled before it. A partition that is not ready marks the
// transaction for an abort (jobFor). One whose Partition is not a
// BatchRejecter stops the stage, as does a batch that is not after the
// records of its topic the job holds (kgo returns a partition's batches in
// offset order).
func (rt *Runtime) addTooLarge(jobs *fetchJobs, tooLarge []*kgo.ErrDecompressTooLarge) error {
	rejected := make([]RejectedBatch, 0, len(tooLarge))
	for _, tl := range tooLarge {
		rejected = append(rejected, RejectedBatch{
			Topic: tl.Topic, Partition: tl.Partition, From: tl.Offset, Next: tl.NextOffset,
			Limit: rt.cfg.MaxDecompressBatchBytes, Err: tl,
		})
	}
	return rt.addRejected(jobs, rejected)
}

// addRejected adds each batch of rejected to its partition's job, as
// addTooLarge does.
func (rt *Runtime) addRejected(jobs *fetchJobs, rejected []RejectedBatch) error {
	for _, rb := range rejected {
		j, err := rt.jobFor(jobs, rb.Topic, rb.Partition)
		if err != nil {
			return err
		}
		if j == nil {
			continue
		}
		if _, ok := j.a.part.(BatchRejecter); !ok {
			if rb.Err == nil {
				return fmt.Errorf("stream: partition %d of %s: the batch at offset %d is malformed: %s (the stage cannot reject such a batch)", rb.Partition, rb.Topic, rb.From, rb.Malformed)
			}
			return fmt.Errorf("stream: partition %d of %s: %w (the stage cannot reject such a batch)", rb.Partition, rb.Topic, rb.Err)
		}
		for _, b := range j.batches {
			if b.topic == rb.Topic && (b.rejected != nil || b.recs[len(b.recs)-1].Offset >= rb.From) {
				return fmt.Errorf("stream: partition %d of %s: the rejected batch at offset %d is not after the records polled with it", rb.Partition, rb.Topic, rb.From)
			}
		}
		j.batches = append(j.batches, fetchBatch{topic: rb.Topic, rejected: &rb})
	}
	return nil
}

// Detail is the detail of b's rejection in usage.rejected, the same for
// every stage (BatchRejecter).
func (b RejectedBatch) Detail() string {
	if b.Malformed != "" {
		return fmt.Sprintf("record batch ending at offset %d is malformed: %s; its records from offset %d not decoded, skipped",
			b.Next-1, b.Malformed, b.From)
	}
	return fmt.Sprintf("record batch at offsets %d to %d decompresses to more than %d bytes with its decoded records; not decoded, skipped",
		b.From, b.Next-1, b.Limit)
}

// skipRewind is where a transaction that does not commit puts back the
// client's position of a partition whose batch was skipped (rewindSkipped),
// while the partition keeps its epoch: the state's input offset once it
// has one, before that at (-1: kgo's own rewind is right).
type skipRewind struct {
	epoch uint64
	at    int64
}

// skipBatch moves the client past the rejected batch b of job j's
// partition, and records where to put it back if the transaction does not
// commit (rewindSkipped). consumed says whether the transaction consumed
// records of b's topic before it.
//
// kgo rewinds an aborted transaction's partitions to what it saw
// committed, or, for a partition the group has no offset of, to the first
// offset it polled; SetOffsets on a partition it has polled nothing of
// records b.Next as that offset. Such a partition's batch would be
// skipped by an abort without its rejection: it is put back at b.From,
// its first batch, or at the state's input offset once a transaction of it
// has committed one.
func (rt *Runtime) skipBatch(j *fetchJob, b RejectedBatch, consumed bool) {
	j.tx.ov.skipped = append(j.tx.ov.skipped, b.Topic)
	rt.skipRebuild = true
	tp := topicPartition{b.Topic, b.Partition}
	if s, ok := rt.skips[tp]; !ok || s.epoch != j.a.epoch {
		at := b.From
		if consumed {
			at = -1
		}
		rt.skips[tp] = skipRewind{epoch: j.a.epoch, at: at}
	}
	switch {
	case b.Malformed == "" && b.Err == nil: // a gap to read again (gaps.go)
		rt.log.Warn("retention deleted the start of an input gap while it was checked: reading the partition again from the log start", zap.String("topic", b.Topic),
			zap.Int32("partition", b.Partition), zap.Int64("from", b.From), zap.Int64("log_start", b.Next))
	case b.Malformed != "":
		rt.log.Warn("an input batch is malformed: rejecting it and skipping it in this transaction", zap.String("topic", b.Topic),
			zap.Int32("partition", b.Partition), zap.Int64("from", b.From), zap.Int64("next", b.Next), zap.String("problem", b.Malformed))
	default:
		rt.log.Warn("an input batch decompresses past the bound: rejecting it and skipping it in this transaction", zap.String("topic", b.Topic),
			zap.Int32("partition", b.Partition), zap.Int64("from", b.From), zap.Int64("next", b.Next), zap.Int("limit", b.Limit))
	}
	var epoch int32 = -1
	var tl *kgo.ErrDecompressTooLarge
	if errors.As(b.Err, &tl) {
		epoch = tl.Epoch
	}
	rt.sess.Client().SetOffsets(map[string]map[int32]kgo.EpochOffset{b.Topic: {b.Partition: {Epoch: epoch, Offset: b.Next}}})
}

// rewindSkipped runs after a transaction ended without committing (kgo has
// rewound the partitions it knows of): it puts every partition that had a
// batch skipped in its current epoch back at the state's input offset, or
// where skipRewind says before the state has one.
func (rt *Runtime) rewindSkipped() error {
	for tp, s := range rt.skips {
		a, ok := rt.active[tp.p]
		if !ok || a.epoch != s.epoch {
			delete(rt.skips, tp)
			continue
		}
		at := s.at
		v, ok, err := rt.store.Get(tp.p, []byte(rt.cfg.inputOffsetKey(tp.topic)))
		if err != nil {
			return fmt.Errorf("stream: rewind partition %d of %s: %w", tp.p, tp.topic, err)
		}
		if ok {
			if at, err = decodeOffset(v); err != nil {
				return fmt.Errorf("stream: rewind partition %d of %s: input offset: %w", tp.p, tp.topic, err)
			}
		}
		if at < 0 {
			continue
		}
		rt.log.Info("transaction not committed: putting back a partition whose batch was skipped", zap.String("topic", tp.topic),
			zap.Int32("partition", tp.p), zap.Int64("offset", at))
		rt.sess.Client().SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.topic: {tp.p: {Epoch: -1, Offset: at}}})
	}
	return nil
}

// fence is a partition's offset of one input topic in a transaction's
// TxnOffsetCommit.
type fence struct {
	topic string
	p     int32
	eo    kgo.EpochOffset
}

// skippedFences returns, for each partition of the transaction that
// skipped a batch, its next input offset of the topic.
func (rt *Runtime) skippedFences() []fence {
	var out []fence
	for _, p := range sortedPartitions(rt.ovs) {
		ov := rt.ovs[p]
		for _, t := range ov.skipped {
			if o, ok := ov.inputNext[rt.cfg.inputOffsetKey(t)]; ok {
				out = append(out, fence{t, p, kgo.EpochOffset{Epoch: -1, Offset: o}})
			}
		}
	}
	return out
}

// setFence sets partition p of topic to eo in req, added if missing.
func setFence(req *kmsg.TxnOffsetCommitRequest, topic string, p int32, eo kgo.EpochOffset) {
	for i := range req.Topics {
		if req.Topics[i].Topic != topic {
			continue
		}
		for k := range req.Topics[i].Partitions {
			if rp := &req.Topics[i].Partitions[k]; rp.Partition == p {
				rp.Offset, rp.LeaderEpoch = eo.Offset, eo.Epoch
				return
			}
		}
	}
	addFence(req, topic, p, eo)
}
