package stream

import (
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
// the group or its coordinator (session.FetchError); records of a partition that is not ready mark
// the transaction for an abort, which rewinds them.
func (rt *Runtime) handleFetches(fs kgo.Fetches) error {
	// A lost group or coordinator is a rejoin, not a stop: the next
	// assignment restores as usual (docs/design.md, Exactly-once, "Crash
	// windows": "zombie after a rebalance"; session.FetchError).
	if err := session.FetchError(rt.log, rt.cfg.Group, fs); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	// First, serially: which partitions can take their records, the open
	// transaction and each partition's overlay. Then the partitions'
	// Process calls run in parallel: each has its own overlay, its own
	// state prefix and its own output order, and shares nothing mutable
	// with the others.
	// A partition's records of every input topic go to one job, so that
	// one goroutine calls its Process (one overlay); the co-partitioned
	// topics' batches first (Config.CopartitionedTopics), each topic's in
	// offset order.
	type batch struct {
		topic string
		recs  []*kgo.Record
	}
	type job struct {
		a       *activePart
		tx      *Tx
		batches []batch
	}
	var jobs []*job
	byPart := map[int32]*job{}
	var perr error
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if perr != nil || len(fp.Records) == 0 {
			return
		}
		a, ok := rt.active[fp.Partition]
		if !ok {
			// Records of a partition that is not restored (a revoke and
			// re-assign raced the poll). They were polled, so the session
			// would commit their offsets: abort instead, which rewinds.
			rt.log.Info("records for a partition not ready; aborting the transaction to rewind",
				zap.Int32("partition", fp.Partition), zap.String("topic", fp.Topic))
			if !rt.inTxn {
				if err := rt.begin(); err != nil {
					perr = err
					return
				}
			}
			rt.mustAbort = true
			return
		}
		if !rt.inTxn {
			if err := rt.begin(); err != nil {
				perr = err
				return
			}
		}
		ov := rt.overlayFor(fp.Partition, a.epoch)
		ov.in.add(fp.Topic, len(fp.Records))
		j, ok := byPart[fp.Partition]
		if !ok {
			j = &job{a: a, tx: &Tx{rt: rt, p: fp.Partition, ov: ov}}
			byPart[fp.Partition] = j
			jobs = append(jobs, j)
		}
		j.batches = append(j.batches, batch{topic: fp.Topic, recs: fp.Records})
	})
	if perr != nil {
		return perr
	}
	err := parallel(len(jobs), func(i int) error {
		j := jobs[i]
		input := rt.cfg.InputTopic
		sort.SliceStable(j.batches, func(a, b int) bool { return j.batches[a].topic != input && j.batches[b].topic == input })
		for _, b := range j.batches {
			if err := j.a.part.Process(j.tx, b.recs); err != nil {
				return fmt.Errorf("stream: process partition %d of %s: %w", j.tx.p, b.topic, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if j.tx.ov.inputNext == nil {
			j.tx.ov.inputNext = map[string]int64{}
		}
		for _, b := range j.batches {
			j.tx.ov.inputNext[rt.cfg.inputOffsetKey(b.topic)] = b.recs[len(b.recs)-1].Offset + 1
			rt.txRecs += len(b.recs)
		}
		j.tx.ov.touched = true
	}
	return nil
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
