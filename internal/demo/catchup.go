package demo

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/topics"
)

// waitCaughtUp waits, once the generator has stopped, until dedup and the
// aggregator have handled every event it wrote. Both stages stay busy
// after that: dedup's ticks advance its watermark every second, and the
// aggregator reads each watermark record it passes on, and its own
// entitlements ticks. Neither lag is ever zero for long, so the end of the
// generator's input is marked once and followed, not chased:
//
//  1. dedup has committed past the end of usage.events as it was when the
//     generator stopped;
//  2. the aggregator has committed past the end of usage.deduped as it was
//     when step 1 held (everything dedup passed on of the generator's
//     events is before it);
//  3. then each of the aggregator's partitions has read its entitlements
//     partition past the time the generator stopped (its ticks bring
//     that), so no event of the generator's waits in its gate any more,
//     and the aggregator has committed two more transactions since, with
//     none aborted: the one that let them through has ended. (A gate lets
//     through Config.FinalChunk records a transaction, and the rest in
//     the next ones; the demo's gates never hold that many.)
//  4. and no customer's balance is pending in it (the last changes go
//     out within a --balance-interval of broker time), seen before two
//     more committed transactions, with none aborted.
//
// The gates themselves are never empty for long: each watermark record
// waits there for the next tick.
func waitCaughtUp(brokers []string, names topics.Names, reg *prometheus.Registry, d time.Duration) error {
	cl, err := kafka.NewClient(kafka.Config{Brokers: brokers})
	if err != nil {
		return err
	}
	defer cl.Close()
	c := &catchUp{adm: kadm.NewClient(cl), names: names, reg: reg, stopped: time.Now()}
	deadline := time.Now().Add(d)
	for {
		done, err := c.step()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: the stages did not catch up within %s (%s; last error: %v)", d, c.stage(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// catchUp is waitCaughtUp's progress.
type catchUp struct {
	adm   *kadm.Client
	names topics.Names
	reg   *prometheus.Registry
	// When the generator had stopped: every event it wrote arrived
	// (its broker time, the embedded broker's clock) before.
	stopped time.Time

	dedupTo map[int32]int64 // step 1's target: usage.events' end offsets
	aggTo   map[int32]int64 // step 2's: usage.deduped's
	reached bool            // step 2 holds
	// Step 3: the aggregator's committed transactions when each
	// partition was first seen read past stopped, and its aborted ones
	// then.
	passedAt map[string]float64
	aborted  float64
	// Step 4: no balance was seen pending since the last abort, when the
	// aggregator had committed drainedAt transactions.
	drained   bool
	drainedAt float64
}

func (c *catchUp) stage() string {
	switch {
	case c.aggTo == nil:
		return "dedup has not read the generator's events"
	case !c.reached:
		return "the aggregator has not read dedup's output"
	case len(c.passedAt) < len(c.aggTo):
		return fmt.Sprintf("the aggregator has read its entitlements past the generator's end on %d of %d partitions", len(c.passedAt), len(c.aggTo))
	default:
		return fmt.Sprintf("the aggregator has customers whose balance has not gone out (%.0f)", metricSum(c.reg, "meterline_aggregate_balances_pending", nil))
	}
}

// step takes one look, and reports whether the stages have caught up.
func (c *catchUp) step() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c.dedupTo == nil {
		ends, err := c.ends(ctx, c.names.EventsTopic())
		if err != nil {
			return false, err
		}
		c.dedupTo = ends
	}
	if c.aggTo == nil {
		ok, err := c.committedPast(ctx, dedupGroup, c.names.EventsTopic(), c.dedupTo)
		if !ok {
			return false, err
		}
		if c.aggTo, err = c.ends(ctx, c.names.DedupedTopic()); err != nil {
			return false, err
		}
	}
	if !c.reached {
		ok, err := c.committedPast(ctx, aggGroup, c.names.DedupedTopic(), c.aggTo)
		if !ok {
			return false, err
		}
		c.reached = true
	}
	return c.gatesPassed(), nil
}

// gatesPassed is steps 3 and 4.
func (c *catchUp) gatesPassed() bool {
	committed := metricSum(c.reg, "meterline_stream_transactions_total", map[string]string{"stage": "aggregate", "outcome": session.Committed})
	aborted := metricSum(c.reg, "meterline_stream_transactions_total", map[string]string{"stage": "aggregate", "outcome": session.Aborted})
	if c.passedAt == nil || aborted != c.aborted {
		// An aborted transaction may have undone what let events through,
		// or the balances it emitted.
		c.passedAt, c.aborted, c.drained = map[string]float64{}, aborted, false
	}
	stopped := float64(c.stopped.UnixMilli()) / 1000
	for p := range c.aggTo {
		l := strconv.Itoa(int(p))
		if _, seen := c.passedAt[l]; !seen && metricSum(c.reg, "meterline_aggregate_entitlements_read_to_seconds", map[string]string{"partition": l}) > stopped {
			c.passedAt[l] = committed
		}
	}
	if len(c.passedAt) < len(c.aggTo) {
		return false
	}
	for _, at := range c.passedAt {
		if committed < at+2 {
			return false
		}
	}
	if !c.drained {
		if metricSum(c.reg, "meterline_aggregate_balances_pending", nil) > 0 {
			return false
		}
		c.drained, c.drainedAt = true, committed
	}
	return committed >= c.drainedAt+2
}

// ends returns the end offsets (high watermarks) of topic's partitions.
func (c *catchUp) ends(ctx context.Context, topic string) (map[int32]int64, error) {
	lo, err := c.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	ends := map[int32]int64{}
	var perr error
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			perr = o.Err
		}
		ends[o.Partition] = o.Offset
	})
	if perr != nil || len(ends) == 0 {
		return nil, fmt.Errorf("demo: end offsets of %s: %v", topic, perr)
	}
	return ends, nil
}

// committedPast reports whether group has committed, on every partition
// of topic, an offset at or past to's.
func (c *catchUp) committedPast(ctx context.Context, group, topic string, to map[int32]int64) (bool, error) {
	offs, err := c.adm.FetchOffsets(ctx, group)
	if err != nil {
		return false, err
	}
	for p, end := range to {
		if end == 0 {
			continue // an empty partition: nothing to read
		}
		o, ok := offs.Lookup(topic, p)
		if !ok || o.Err != nil || o.At < end {
			return false, nil
		}
	}
	return true, nil
}
