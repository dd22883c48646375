package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// latencies are the quantiles of the latencies measured.
type latencies struct {
	p50, p99 time.Duration
	n        int
}

// latencyTarget is what a latency phase sends and watches for.
type latencyTarget interface {
	// send sends event i (asynchronously: it returns once the event is
	// buffered) and returns the tag by which seen knows its outcome.
	send(ctx context.Context, i int) (tag string, err error)
	// seen returns the tag of a record of the watched topic, or "".
	seen(r *kgo.Record) string
}

// latencyPhase sends rate events per second for dur into a running stage
// and times each from its send to its outcome becoming visible
// (read_committed) in the watched topic. It waits up to 30 s more for the
// last outcomes.
type latencyPhase struct {
	env    *Env
	watch  string // the topic where outcomes appear
	rate   int
	dur    time.Duration
	target latencyTarget
	what   string // what becomes visible, for the error when nothing does
}

func (lp latencyPhase) run(ctx context.Context) (latencies, error) {
	cl, err := lp.env.client(kgo.ConsumeTopics(lp.watch),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return latencies{}, err
	}
	defer cl.Close()
	// Make sure the consumer is positioned before sending.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cl.PollFetches(pctx)
	cancel()

	sent := map[string]time.Time{}
	var lats []time.Duration
	total := int(float64(lp.rate) * lp.dur.Seconds())
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	per := max(lp.rate/100, 1)
	i, seen := 0, 0
	deadline := time.Now().Add(lp.dur + 30*time.Second)
	for seen < total && time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return latencies{}, err
		}
		if i < total {
			<-tick.C
			for j := 0; j < per && i < total; j++ {
				tag, err := lp.target.send(ctx, i)
				if err != nil {
					return latencies{}, err
				}
				sent[tag] = time.Now()
				i++
			}
		}
		fctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		fs := cl.PollFetches(fctx)
		cancel()
		at := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			tag := lp.target.seen(r)
			if t0, ok := sent[tag]; ok {
				lats = append(lats, at.Sub(t0))
				delete(sent, tag)
				seen++
			}
		})
	}
	return quantiles(lats, lp.what)
}

// quantiles sorts the latencies measured and returns their p50 and p99.
func quantiles(lats []time.Duration, what string) (latencies, error) {
	if len(lats) == 0 {
		return latencies{}, fmt.Errorf("bench: latency: no %s became visible", what)
	}
	slices.Sort(lats)
	q := func(f float64) time.Duration { return lats[int(f*float64(len(lats)-1))] }
	return latencies{p50: q(0.50), p99: q(0.99), n: len(lats)}, nil
}
