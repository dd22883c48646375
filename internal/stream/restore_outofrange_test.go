package stream

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
)

// TestRestoreOutOfRangeBacksOff: a restore whose changelog fetches stay
// out of range (each answered OFFSET_OUT_OF_RANGE, as from a stale leader
// or a retention that stays ahead of the copy) plans again after each,
// waiting 0.5 s, then twice as long each time up to 30 s, rather than
// every 0.5 s for ever; it warns at the first re-plan and then at most
// once a minute, naming the re-plans in a row and those not logged since;
// and meterline_stream_restore_out_of_range_replans shows the re-plans in
// a row while it lasts, absent once the restore ends.
func TestRestoreOutOfRangeBacksOff(t *testing.T) {
	t.Parallel()
	w, rt, reg, clk, logs, outOfRange := newOutOfRangeRestore(t)

	const replans = 14
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var waits []time.Duration
	var gauges []float64
	rt.replanWait = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		v, ok := gaugeValue(t, reg, "meterline_stream_restore_out_of_range_replans")
		if !ok {
			v = -1
		}
		gauges = append(gauges, v)
		clk.skew.Add(int64(d)) // the wait, on the stage's clock
		if len(waits) == replans {
			cancel()
		}
		return ctx.Err()
	}
	_, _, _, err := rt.restorePartition(ctx, w.cl, rt.log, 0, 0, map[string]int64{w.input: -1}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("restore: %v; want it still planning again when cancelled", err)
	}

	s := time.Second
	want := []time.Duration{s / 2, s, 2 * s, 4 * s, 8 * s, 16 * s, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s}
	if !slices.Equal(waits, want) {
		t.Errorf("waits before each plan %v; want %v", waits, want)
	}
	if n := outOfRange.Load(); n < replans {
		t.Errorf("%d changelog fetches answered out of range; want one a plan at least, %d", n, replans)
	}
	for i, v := range gauges {
		if v != float64(i+1) {
			t.Errorf("meterline_stream_restore_out_of_range_replans before wait %d: %v (-1: absent); want %d", i+1, v, i+1)
		}
	}
	if v, ok := gaugeValue(t, reg, "meterline_stream_restore_out_of_range_replans"); ok {
		t.Errorf("meterline_stream_restore_out_of_range_replans is %v once the restore ended; want it absent", v)
	}
	// Re-plans at 0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 61.5, 91.5, ... s:
	// warned at the first, then at the first a minute or more after the
	// last warning.
	var logged, notLogged []int64
	for _, e := range logs.FilterMessageSnippet("planning again").All() {
		n, _ := e.ContextMap()["replans"].(int64)
		m, _ := e.ContextMap()["not_logged"].(int64)
		logged, notLogged = append(logged, n), append(notLogged, m)
	}
	if want := []int64{1, 8, 10, 12, 14}; !slices.Equal(logged, want) {
		t.Errorf("warnings at re-plans %v; want %v", logged, want)
	}
	if want := []int64{0, 6, 1, 1, 1}; !slices.Equal(notLogged, want) {
		t.Errorf("re-plans not logged before each warning %v; want %v", notLogged, want)
	}
}

// newOutOfRangeRestore returns a kv world whose changelog holds three
// records and answers every fetch of it OFFSET_OUT_OF_RANGE (counted in
// outOfRange), and a runtime on it whose clock is clk, whose warnings go
// to logs and whose metrics to reg.
func newOutOfRangeRestore(t *testing.T) (w *kvWorld, rt *Runtime, reg *prometheus.Registry, clk *skewClock, logs *observer.ObservedLogs, outOfRange *atomic.Int64) {
	t.Helper()
	w = newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact,delete"), "delete.retention.ms": ptr("86400000")})
	recs := kvRecords("a", "1", "b", "1", "c", "1")
	for _, r := range recs {
		r.Topic = w.changelog
	}
	if err := w.cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id := w.changelogID()
	outOfRange = new(atomic.Int64)
	w.cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		fr := req.(*kmsg.FetchRequest)
		resp := fr.ResponseKind().(*kmsg.FetchResponse)
		resp.Version = fr.Version
		for _, tp := range fr.Topics {
			if tp.TopicID != id && tp.Topic != w.changelog {
				return nil, nil, false
			}
			rtp := kmsg.NewFetchResponseTopic()
			rtp.Topic, rtp.TopicID = tp.Topic, tp.TopicID
			for _, pp := range tp.Partitions {
				rp := kmsg.NewFetchResponseTopicPartition()
				rp.Partition, rp.ErrorCode = pp.Partition, kerr.OffsetOutOfRange.Code
				rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = -1, -1, -1
				rtp.Partitions = append(rtp.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rtp)
		}
		if len(resp.Topics) == 0 {
			return nil, nil, false
		}
		outOfRange.Add(1)
		return resp, nil, true
	})

	clk = &skewClock{}
	obs, logs := observer.New(zap.WarnLevel)
	reg = prometheus.NewRegistry()
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: "r"},
		InputTopic: w.input, ChangelogTopic: w.changelog, FS: vfs.NewMem(), Clock: clk,
		Logger:     zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), obs)),
		Registerer: reg}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.store.Close() })

	return w, rt, reg, clk, logs, outOfRange
}

// TestRestoreOutOfRangeGaugeOwnedByNewerRestore: a restore of partition 0
// abandoned while its changelog fetches stay out of range (the partition
// revoked and assigned here again: a newer restore of another epoch runs
// meanwhile) neither overwrites the newer restore's
// meterline_stream_restore_out_of_range_replans at its next re-plan, nor
// deletes it when it ends: the newer restore owns the gauge.
func TestRestoreOutOfRangeGaugeOwnedByNewerRestore(t *testing.T) {
	t.Parallel()
	w, rt, reg, _, _, _ := newOutOfRangeRestore(t)
	const name = "meterline_stream_restore_out_of_range_replans"
	abandonRestore(t, w, rt, func(waits int, cancel func()) {
		switch waits {
		case 2:
			// Partition 0 assigned anew: the restore of epoch 2 begins
			// and exports its first re-plan; this one, of epoch 1,
			// fetches and plans once more before it sees its end.
			rt.mu.Lock()
			rt.parts[0] = &partState{epoch: 2}
			rt.m.outOfRangeReplans.WithLabelValues("0").Set(1)
			rt.mu.Unlock()
		case 3:
			cancel()
		}
	})
	if v, ok := gaugeValue(t, reg, name); !ok || v != 1 {
		t.Errorf("%s is %v (present %v) once the abandoned restore ended; want the newer restore's 1", name, v, ok)
	}
}

// abandonRestore runs the restore of partition 0 of epoch 1 on w's
// out-of-range changelog (newOutOfRangeRestore), with partition 0 held by
// epoch 1, until it is cancelled while it plans again. step runs at each
// of its waits between plans (waits counts them), and cancels the restore
// with cancel.
func abandonRestore(t *testing.T, w *kvWorld, rt *Runtime, step func(waits int, cancel func())) {
	t.Helper()
	rt.parts[0] = &partState{epoch: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waits := 0
	rt.replanWait = func(ctx context.Context, d time.Duration) error {
		waits++
		step(waits, cancel)
		return ctx.Err()
	}
	_, _, _, err := rt.restorePartition(ctx, w.cl, rt.log, 0, 1, map[string]int64{w.input: -1}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("restore: %v; want it still planning again when cancelled", err)
	}
}
