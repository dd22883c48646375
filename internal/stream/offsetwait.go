package stream

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// A partition assigned to the instance is read from the group's committed
// offsets once they are stable (docs/design.md, Exactly-once, 3): kgo asks
// for them with require_stable, and while a transaction that commits
// offsets of the partition for the group is open (a previous owner's, a
// zombie's), the coordinator answers UNSTABLE_OFFSET_COMMIT and kgo asks
// again every second, without a bound, until that transaction commits,
// aborts or times out (its transaction.timeout.ms). Until then the
// partition is neither restoring nor processing, and the runtime hears of
// it only when kgo calls Assigned. offsetWait follows such partitions from
// the group's assignment (the balancer's ParseSyncAssignment) to Assigned,
// and asks the coordinator itself, once one has waited for offsetProbeAfter
// and then every offsetProbeEvery, whether their offsets are unstable, so
// that /readyz, the status page and the metrics say what the partition
// waits for, and for how long.
type offsetWait struct {
	mu sync.Mutex
	// since holds each waiting partition's start of the wait: when the
	// group assigned it.
	since map[int32]time.Time
	// open holds the waiting partitions the coordinator last answered
	// UNSTABLE_OFFSET_COMMIT for.
	open map[int32]bool
	// warned holds the partitions whose wait on an open transaction was
	// logged.
	warned map[int32]bool
}

// offsetProbeAfter is how long a partition waits for its committed offsets
// before the runtime asks the coordinator why: longer than the round trip
// of kgo's own fetch, shorter than its retry (1 s).
const offsetProbeAfter = 500 * time.Millisecond

// offsetProbeEvery is the pace of the runtime's questions while partitions
// wait.
const offsetProbeEvery = time.Second

// Causes of a wait for committed offsets: the cause label of
// meterline_stream_offsets_waiting_partitions.
const (
	// waitOpenTxn: the coordinator answered UNSTABLE_OFFSET_COMMIT.
	waitOpenTxn = "open_transaction"
	// waitFetch: the fetch of the offsets has not returned (yet), for
	// no cause the coordinator named.
	waitFetch = "fetch"
)

// awaitOffsets records the partitions of the group's new assignment as
// waiting for their committed offsets; a partition still waiting from an
// earlier assignment keeps the start of its wait. It runs on kgo's group
// goroutine, from the balancer.
func (rt *Runtime) awaitOffsets(owned []int32) {
	w := &rt.offWait
	now := time.Now()
	w.mu.Lock()
	if w.since == nil {
		w.since, w.open, w.warned = map[int32]time.Time{}, map[int32]bool{}, map[int32]bool{}
	}
	for p := range w.since {
		if !slices.Contains(owned, p) {
			w.forget(p)
		}
	}
	for _, p := range owned {
		if _, ok := w.since[p]; !ok {
			w.since[p] = now
		}
	}
	w.mu.Unlock()
	rt.setOffsetWaitGauges()
}

// offsetsArrived ends the wait of partitions: kgo passed on their
// committed offsets.
func (rt *Runtime) offsetsArrived(parts []int32) { rt.endOffsetWaits(parts, true) }

// dropOffsetWaits ends the wait of partitions (nil: all of them) revoked
// or lost, or of a session that ended.
func (rt *Runtime) dropOffsetWaits(parts []int32) { rt.endOffsetWaits(parts, false) }

func (rt *Runtime) endOffsetWaits(parts []int32, arrived bool) {
	w := &rt.offWait
	w.mu.Lock()
	if parts == nil {
		parts = slices.Collect(maps.Keys(w.since))
	}
	for _, p := range parts {
		if arrived && w.open[p] {
			rt.log.Info("partition's committed offsets are stable: the transaction that held them ended",
				zap.Int32("partition", p), zap.Duration("waited", time.Since(w.since[p]).Round(time.Millisecond)))
		}
		w.forget(p)
	}
	w.mu.Unlock()
	rt.setOffsetWaitGauges()
}

// forget drops p's wait; w.mu held.
func (w *offsetWait) forget(p int32) {
	delete(w.since, p)
	delete(w.open, p)
	delete(w.warned, p)
}

// setOffsetWaitGauges sets meterline_stream_offsets_waiting_partitions
// and meterline_stream_offsets_wait_seconds (the longest current wait, 0
// when none waits).
func (rt *Runtime) setOffsetWaitGauges() {
	w := &rt.offWait
	w.mu.Lock()
	open := len(w.open)
	fetch := len(w.since) - open
	var longest time.Duration
	for _, t := range w.since {
		longest = max(longest, time.Since(t))
	}
	w.mu.Unlock()
	if rt.m == nil { // a runtime of a balancer test, without metrics
		return
	}
	rt.m.offsetsWaiting.WithLabelValues(waitOpenTxn).Set(float64(open))
	rt.m.offsetsWaiting.WithLabelValues(waitFetch).Set(float64(fetch))
	rt.m.offsetsWaitSeconds.Set(longest.Seconds())
}

// OffsetWait is an input partition assigned to the instance that waits
// for the group's committed offsets: since when, and whether a
// transaction that commits offsets of it (a previous owner's) is open.
type OffsetWait struct {
	Partition int32
	Since     time.Time
	OpenTxn   bool
}

// offsetWaits returns the waiting partitions in partition order.
func (rt *Runtime) offsetWaits() []OffsetWait {
	w := &rt.offWait
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]OffsetWait, 0, len(w.since))
	for _, p := range slices.Sorted(maps.Keys(w.since)) {
		out = append(out, OffsetWait{Partition: p, Since: w.since[p], OpenTxn: w.open[p]})
	}
	return out
}

// EachOffsetWait calls fn for every input partition assigned to the
// instance that waits for the group's committed offsets, in partition
// order: since when, and why (empty while the coordinator has not named a
// cause).
func (rt *Runtime) EachOffsetWait(fn func(p int32, since time.Time, why string)) {
	for _, w := range rt.offsetWaits() {
		why := ""
		if w.OpenTxn {
			why = openOffsetsWhy
		}
		fn(w.Partition, w.Since, why)
	}
}

// openOffsetsWhy says why a partition waits on UNSTABLE_OFFSET_COMMIT.
const openOffsetsWhy = "a previous owner's open transaction commits offsets of it (UNSTABLE_OFFSET_COMMIT): its committed offset is known once that transaction commits, aborts or times out (transaction.timeout.ms)"

// offsetWaitNotReady returns why the stage is not ready while partitions
// wait for their committed offsets; nil when none waits.
func (rt *Runtime) offsetWaitNotReady() error {
	ws := rt.offsetWaits()
	if len(ws) == 0 {
		return nil
	}
	var open, fetch []int32
	var longest time.Duration
	for _, w := range ws {
		longest = max(longest, time.Since(w.Since))
		if w.OpenTxn {
			open = append(open, w.Partition)
		} else {
			fetch = append(fetch, w.Partition)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d partitions waiting for their committed offsets, for up to %s, nothing processed there", len(ws), longest.Round(time.Second))
	if len(open) > 0 {
		fmt.Fprintf(&b, ": partitions %s: %s", shortList(open), openOffsetsWhy)
	}
	if len(fetch) > 0 {
		fmt.Fprintf(&b, "; partitions %s: fetching them from the group's coordinator", shortList(fetch))
	}
	return fmt.Errorf("%s", b.String())
}

// shortList formats up to 10 partitions, and how many more.
func shortList(ps []int32) string {
	if len(ps) <= refusalShown {
		return fmt.Sprint(ps)
	}
	return fmt.Sprintf("%v and %d more", ps[:refusalShown], len(ps)-refusalShown)
}

// probeOffsetWaits asks the group's coordinator, through cl, every
// offsetProbeEvery until ctx ends, whether the committed offsets of the
// partitions waiting for longer than offsetProbeAfter are unstable, and
// keeps meterline_stream_offsets_wait_seconds current meanwhile.
func (rt *Runtime) probeOffsetWaits(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(offsetProbeAfter / 2)
	defer t.Stop()
	var next time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rt.setOffsetWaitGauges()
		var due []int32
		for _, w := range rt.offsetWaits() {
			if time.Since(w.Since) >= offsetProbeAfter {
				due = append(due, w.Partition)
			}
		}
		if len(due) == 0 || time.Now().Before(next) {
			continue
		}
		next = time.Now().Add(offsetProbeEvery)
		unstable, err := rt.unstableOffsets(ctx, cl, due)
		if err != nil {
			rt.log.Debug("cannot ask the group's coordinator whether the committed offsets of the partitions waiting for them are stable", zap.Error(err))
			continue
		}
		rt.noteUnstable(due, unstable)
	}
}

// noteUnstable records, of the partitions asked about, those whose
// offsets are unstable, for those still waiting.
func (rt *Runtime) noteUnstable(asked []int32, unstable map[int32]bool) {
	w := &rt.offWait
	w.mu.Lock()
	var logNow []int32
	for _, p := range asked {
		if _, ok := w.since[p]; !ok {
			continue // arrived meanwhile
		}
		if !unstable[p] {
			delete(w.open, p)
			continue
		}
		w.open[p] = true
		if !w.warned[p] {
			w.warned[p] = true
			logNow = append(logNow, p)
		}
	}
	w.mu.Unlock()
	rt.setOffsetWaitGauges()
	if len(logNow) > 0 {
		rt.log.Warn("partitions assigned here wait for their committed offsets: a previous owner's open transaction commits offsets of them (UNSTABLE_OFFSET_COMMIT); nothing of them is processed until it commits, aborts or times out (transaction.timeout.ms)",
			zap.Int32s("partitions", logNow[:min(len(logNow), refusalShown)]), zap.Int("partitions_waiting", len(logNow)))
	}
}

// unstableOffsets asks the group's coordinator for the committed offsets
// of partitions ps of every input topic with require_stable, as kgo does,
// and returns those it answers UNSTABLE_OFFSET_COMMIT for, in any topic.
func (rt *Runtime) unstableOffsets(ctx context.Context, cl *kgo.Client, ps []int32) (map[int32]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, offsetProbeEvery*5)
	defer cancel()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.RequireStable = true
	g := kmsg.NewOffsetFetchRequestGroup()
	g.Group = rt.cfg.Group
	for _, topic := range rt.cfg.inputs() {
		rq := kmsg.NewOffsetFetchRequestGroupTopic()
		rq.Topic, rq.Partitions = topic, ps
		g.Topics = append(g.Topics, rq)
	}
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := map[int32]bool{}
	for _, rg := range resp.Groups {
		if err := kerr.ErrorForCode(rg.ErrorCode); err != nil {
			return nil, err
		}
		for _, rt := range rg.Topics {
			for _, rp := range rt.Partitions {
				if rp.ErrorCode == kerr.UnstableOffsetCommit.Code {
					out[rp.Partition] = true
				}
			}
		}
	}
	return out, nil
}
