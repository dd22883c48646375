package stream

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/session"
)

// handleFetches hands each ready partition its polled records, in the open
// transaction (begun here if none is): a fetch error stops the stage
// unless it only says that the poll was cut short or that this member lost
// the group or its coordinator (session.FetchError), or names a batch that
// decompresses past the bound, which the partition rejects
// (rejectOversized), or a batch left for a later fetch by the
// decompression budget (decompress.go); records of a partition that is not ready mark
// the transaction for an abort, which rewinds them.
func (rt *Runtime) handleFetches(ctx context.Context, fs kgo.Fetches) error {
	// The records polled are processed when this returns: the next
	// fetches may decompress as much again (decompress.go).
	defer rt.decomp.reset()
	rt.takeDeferred(fs)
	tooLarge := takeTooLarge(fs)
	outOfRange := rt.takeOutOfRange(fs)
	// A lost group or coordinator is a rejoin, not a stop: the next
	// assignment restores as usual (docs/design.md, Exactly-once, "Crash
	// windows": "zombie after a rebalance"; session.FetchError).
	if err := session.FetchError(rt.log, rt.cfg.Kafka.Principal(), rt.cfg.Group, fs); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	// Offsets of the input the client skipped, checked before any of the
	// poll's records is processed (gaps.go).
	malformed, reread, tooLarge, err := rt.checkGaps(ctx, fs, tooLarge, outOfRange)
	if err != nil {
		return err
	}
	// First, serially: which partitions can take their records, the open
	// transaction and each partition's overlay. Then the partitions'
	// Process calls run in parallel: each has its own overlay, its own
	// state prefix and its own output order, and shares nothing mutable
	// with the others.
	// A partition's records of every input topic go to one job, so that
	// one goroutine calls its Process (one overlay); the co-partitioned
	// topics' batches first (Config.CopartitionedTopics), each topic's in
	// offset order, a rejected batch after the records polled before it.
	jobs := &fetchJobs{byPart: map[int32]*fetchJob{}}
	var perr error
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if perr != nil || len(fp.Records) == 0 {
			return
		}
		j, err := rt.jobFor(jobs, fp.Topic, fp.Partition)
		if j == nil || err != nil {
			perr = err
			return
		}
		j.tx.ov.in.add(fp.Topic, len(fp.Records))
		j.batches = append(j.batches, fetchBatch{topic: fp.Topic, recs: fp.Records})
	})
	if perr != nil {
		return perr
	}
	if err := rt.addTooLarge(jobs, tooLarge); err != nil {
		return err
	}
	if err := rt.addRejected(jobs, malformed); err != nil {
		return err
	}
	if err := rt.addReread(jobs, reread); err != nil {
		return err
	}
	err = parallel(len(jobs.list), func(i int) error {
		j := jobs.list[i]
		input := rt.cfg.InputTopic
		sort.SliceStable(j.batches, func(a, b int) bool { return j.batches[a].topic != input && j.batches[b].topic == input })
		for _, b := range j.batches {
			if b.reread {
				continue
			}
			if b.rejected != nil {
				if err := j.a.part.(BatchRejecter).RejectBatch(j.tx, *b.rejected); err != nil {
					return fmt.Errorf("stream: reject a batch of partition %d of %s: %w", j.tx.p, b.topic, err)
				}
				continue
			}
			if err := j.a.part.Process(j.tx, b.recs); err != nil {
				return fmt.Errorf("stream: process partition %d of %s: %w", j.tx.p, b.topic, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, j := range jobs.list {
		if j.tx.ov.inputNext == nil {
			j.tx.ov.inputNext = map[string]int64{}
		}
		for _, b := range j.batches {
			k := rt.cfg.inputOffsetKey(b.topic)
			if b.rejected != nil {
				_, consumed := j.tx.ov.inputNext[k]
				rt.skipBatch(j, *b.rejected, consumed)
				j.tx.ov.inputNext[k] = b.rejected.Next
				continue
			}
			j.tx.ov.inputNext[k] = b.recs[len(b.recs)-1].Offset + 1
			rt.txRecs += len(b.recs)
		}
		j.tx.ov.touched = true
	}
	return nil
}

// fetchBatch is one topic's records of a poll for a partition, or a batch
// of it the partition rejects, or, with reread, a gap it skips and reads
// again after (gaps.go).
type fetchBatch struct {
	topic    string
	recs     []*kgo.Record
	rejected *RejectedBatch
	reread   bool
}

// fetchJob is what one partition is given of a poll.
type fetchJob struct {
	a       *activePart
	tx      *Tx
	batches []fetchBatch
}

type fetchJobs struct {
	list   []*fetchJob
	byPart map[int32]*fetchJob
}

// jobFor returns partition p's job in jobs, beginning the transaction if
// none is open. For a partition that is not restored (a revoke and
// re-assign raced the poll) it returns nil and marks the transaction for
// an abort: its records were polled, so the session would commit their
// offsets; the abort rewinds instead.
func (rt *Runtime) jobFor(jobs *fetchJobs, topic string, p int32) (*fetchJob, error) {
	if !rt.inTxn {
		if err := rt.begin(); err != nil {
			return nil, err
		}
	}
	a, ok := rt.active[p]
	if !ok {
		rt.log.Info("records for a partition not ready; aborting the transaction to rewind",
			zap.Int32("partition", p), zap.String("topic", topic))
		rt.mustAbort = true
		return nil, nil
	}
	j, ok := jobs.byPart[p]
	if !ok {
		j = &fetchJob{a: a, tx: &Tx{rt: rt, p: p, ov: rt.overlayFor(p, a.epoch)}}
		jobs.byPart[p] = j
		jobs.list = append(jobs.list, j)
	}
	return j, nil
}

// parallel calls fn(0) … fn(n-1) on up to GOMAXPROCS goroutines and
// returns the error of the lowest i that failed. A panic in fn (a
// simulated crash, fault.Crash, or a bug) is raised again in the caller's
// goroutine once every call has returned, so that Run's recovery sees it.
func parallel(n int, fn func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, n)
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		panicMu  sync.Mutex
		panicked any
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if v := recover(); v != nil {
					if _, crash := v.(fault.Crash); !crash {
						v = fmt.Sprintf("%v\n\ngoroutine stack of the panic:\n%s", v, debug.Stack())
					}
					panicMu.Lock()
					if panicked == nil {
						panicked = v
					}
					panicMu.Unlock()
				}
			}()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				errs[i] = fn(i)
			}
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// punctuate calls Punctuate on every active partition, in the open
// transaction (begun here if none is).
func (rt *Runtime) punctuate() error {
	for _, p := range sortedPartitions(rt.active) {
		a := rt.active[p]
		if !rt.inTxn {
			if err := rt.begin(); err != nil {
				return err
			}
		}
		tx := &Tx{rt: rt, p: p, ov: rt.overlayFor(p, a.epoch)}
		if err := a.part.Punctuate(tx); err != nil {
			return fmt.Errorf("stream: punctuate partition %d: %w", p, err)
		}
	}
	return nil
}
