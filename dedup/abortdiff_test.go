package dedup

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// dedupDiffCfg is the configuration of a differential run: hourly buckets
// that expire two hours and a minute after their end.
var dedupDiffCfg = Config{Window: 2 * time.Hour, Skew: time.Minute, Bucket: time.Hour, WatermarkEvery: 10 * time.Minute}

// dedupDiffScript is the input of a differential run, in transactions:
// events arriving every 7 minutes for 10 hours, with copies of earlier
// ones (the same, or another payload) within W and past it, and signed
// ticks of pr, one of three too close to the one before to forward the
// watermark; now and then a batch rejected unread (a record without a
// value marks it, of 3 offsets).
func dedupDiffScript(pr *processor) [][]*kgo.Record {
	topic := pr.eventsTopic
	start := int64(1_790_000_000_000) / time.Hour.Milliseconds() * time.Hour.Milliseconds()
	var out [][]*kgo.Record
	var txn []*kgo.Record
	var off int64
	add := func(id string, q int64, at int64) {
		e := &schemas.UsageEvent{EventID: id, CustomerID: "c", Meter: "m", Quantity: q, EventTime: at - 1000, Source: "test"}
		txn = append(txn, &kgo.Record{Topic: topic, Key: e.Identity().Key(), Value: schemas.MustEncode(e), Offset: off,
			Timestamp: time.UnixMilli(at)})
		off++
	}
	for i := range 90 {
		at := start + int64(i)*7*time.Minute.Milliseconds()
		add(fmt.Sprintf("e%d", i), 1, at)
		if i >= 3 {
			add(fmt.Sprintf("e%d", i-3), 1, at+1) // a copy, the same
		}
		if i >= 10 && i%4 == 0 {
			add(fmt.Sprintf("e%d", i-10), 2, at+2) // a copy, another payload
		}
		if i >= 40 && i%9 == 0 {
			add(fmt.Sprintf("e%d", i-40), 1, at+3) // past W: its key expired
		}
		if i%3 != 1 {
			txn = append(txn, &kgo.Record{Topic: topic, Value: pr.tickValue, Headers: pr.keys.tickHeaders(topic, 0, pr.tickValue),
				Offset: off, Timestamp: time.UnixMilli(at + 4)})
			off++
		}
		if i%17 == 5 {
			// A batch rejected unread, of 3 offsets (dedupDiffRejected).
			txn = append(txn, &kgo.Record{Topic: topic, Offset: off})
			off += 3
		}
		if i%3 == 2 {
			out, txn = append(out, txn), nil
		}
	}
	return append(out, txn)
}

type dedupDiffResult struct{ state, out, counters []string }

// runDedupDiff runs the script; at transaction at it departs from the
// uninterrupted run as how says. Every transaction is followed by a
// punctuate-only one.
func runDedupDiff(tb testing.TB, at int, how string) dedupDiffResult {
	tb.Helper()
	reg := prometheus.NewRegistry()
	pr := localProcessor(tb, dedupDiffCfg, reg)
	l, err := stream.NewLocal(pr, 0, pr.eventsTopic)
	if err != nil {
		tb.Fatal(err)
	}
	l.Keep()
	var res dedupDiffResult
	commit := func() {
		tb.Helper()
		if err := l.Commit(); err != nil {
			tb.Fatal(err)
		}
		for _, r := range l.TakeOutput() {
			if r.Topic == pr.eventsTopic {
				continue // ticks
			}
			res.out = append(res.out, fmt.Sprintf("%s %x %x", r.Topic, r.Key, r.Value))
		}
	}
	punctuate := func() {
		tb.Helper()
		if err := l.Punctuate(); err != nil {
			tb.Fatal(err)
		}
		commit()
	}
	reopen := func(restart bool) {
		tb.Helper()
		cl := l.Changelog()
		if err := l.Close(); err != nil {
			tb.Fatal(err)
		}
		if restart {
			reg = prometheus.NewRegistry()
			pr = localProcessor(tb, dedupDiffCfg, reg)
		}
		if l, err = stream.RestoreLocal(pr, 0, pr.eventsTopic, cl); err != nil {
			tb.Fatalf("the partition does not open again: %v", err)
		}
	}
	process := func(recs []*kgo.Record) {
		tb.Helper()
		for len(recs) > 0 {
			n := 0
			for n < len(recs) && recs[n].Value != nil {
				n++
			}
			if err := l.Process(recs[:n]); err != nil {
				tb.Fatal(err)
			}
			if recs = recs[n:]; len(recs) > 0 {
				// dedupDiffScript's mark of a batch rejected unread.
				b := stream.RejectedBatch{Topic: recs[0].Topic, From: recs[0].Offset, Next: recs[0].Offset + 3, Limit: 1 << 20}
				if err := l.RejectBatch(b); err != nil {
					tb.Fatal(err)
				}
				recs = recs[1:]
			}
		}
	}
	for i, txn := range dedupDiffScript(pr) {
		process(txn)
		if i == at {
			switch how {
			case "abort":
				l.Abort()
				process(txn)
			case "punctuate-abort":
				if err := l.Punctuate(); err != nil {
					tb.Fatal(err)
				}
				l.Abort()
				process(txn)
			case "abort-punctuate":
				l.Abort()
				punctuate()
				process(txn)
			case "abort-punctuate-reassign":
				l.Abort()
				punctuate()
				reopen(false)
				process(txn)
			case "abort-reassign", "abort-restart":
				l.Abort()
				reopen(how == "abort-restart")
				process(txn)
			}
		}
		commit()
		if i == at && (how == "reassign" || how == "restart") {
			reopen(how == "restart")
		}
		punctuate()
	}
	it, err := l.DB().NewIter(nil)
	if err != nil {
		tb.Fatal(err)
	}
	for it.First(); it.Valid(); it.Next() {
		res.state = append(res.state, fmt.Sprintf("%q=%x", it.Key(), it.Value()))
	}
	if err := it.Close(); err != nil {
		tb.Fatal(err)
	}
	if !strings.HasSuffix(how, "restart") {
		res.counters = dedupCounters(tb, reg)
	}
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
	return res
}

// dedupCounters lists the counters of reg.
func dedupCounters(tb testing.TB, reg *prometheus.Registry) []string {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetType() != dto.MetricType_COUNTER {
			continue
		}
		for _, m := range mf.GetMetric() {
			var b strings.Builder
			for _, lp := range m.GetLabel() {
				fmt.Fprintf(&b, "%s=%s,", lp.GetName(), lp.GetValue())
			}
			out = append(out, fmt.Sprintf("%s{%s} %v", mf.GetName(), b.String(), m.GetCounter().GetValue()))
		}
	}
	return out
}

// forgetForwards is r without its watermark records (usage.deduped, no
// key) and its count of throttled ticks.
func forgetForwards(r dedupDiffResult) dedupDiffResult {
	out := dedupDiffResult{state: r.state}
	for _, o := range r.out {
		if !strings.HasPrefix(o, topics.DefaultNames().DedupedTopic()+"  ") {
			out.out = append(out.out, o)
		}
	}
	for _, c := range r.counters {
		if !strings.HasPrefix(c, "meterline_dedup_ticks_throttled_total") {
			out.counters = append(out.counters, c)
		}
	}
	if r.counters == nil {
		out.counters = nil
	}
	return out
}

func firstDiff(what string, want, got []string) string {
	if slices.Equal(want, got) {
		return ""
	}
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			return fmt.Sprintf("%s (%d lines, want %d): line %d\n  got  %.300s\n  want %.300s\n", what, len(got), len(want), i, got[i], want[i])
		}
	}
	return fmt.Sprintf("%s: %d lines, want %d\n", what, len(got), len(want))
}

// TestDedupAbortDifferential: the input run with an abort (then the same
// transaction again, a punctuate-only transaction first, with a
// reassignment after it or not, or a reassignment or restart first; or
// of a transaction that punctuated), or a reassignment or a restart, at any
// transaction boundary commits the state, the output and the counts of
// the run without.
func TestDedupAbortDifferential(t *testing.T) {
	base := runDedupDiff(t, -1, "")
	n := len(dedupDiffScript(localProcessor(t, dedupDiffCfg, prometheus.NewRegistry())))
	t.Logf("%d state keys, %d records out, %d transactions", len(base.state), len(base.out), n)
	for _, how := range []string{"abort", "abort-punctuate", "punctuate-abort", "abort-punctuate-reassign", "abort-reassign", "abort-restart", "reassign", "restart"} {
		for i := range n {
			got := runDedupDiff(t, i, how)
			want := base
			if strings.HasSuffix(how, "reassign") || strings.HasSuffix(how, "restart") {
				// A partition opened again forgets when it last forwarded
				// the watermark (its first tick forwards it): the
				// watermark records and the throttled ticks are left out.
				want, got = forgetForwards(want), forgetForwards(got)
			}
			msg := firstDiff("state", want.state, got.state) + firstDiff("output", want.out, got.out)
			if got.counters != nil {
				msg += firstDiff("counters", want.counters, got.counters)
			}
			if msg != "" {
				t.Errorf("%s at transaction %d:\n%s", how, i, msg)
			}
		}
	}
}
