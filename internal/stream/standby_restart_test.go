package stream

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// refuseChangelogFetches answers every fetch (only a standby tail fetches
// in the test) with TOPIC_AUTHORIZATION_FAILED for w's changelog while
// refuse is set, and counts them.
func refuseChangelogFetches(w *kvWorld, refuse *atomic.Bool) *atomic.Int64 {
	id := w.changelogID()
	var n atomic.Int64
	w.cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		// Every fetch: a fetch session's requests name no partition
		// whose position did not change.
		resp := kreq.(*kmsg.FetchRequest).ResponseKind().(*kmsg.FetchResponse)
		st := kmsg.NewFetchResponseTopic()
		st.Topic, st.TopicID = w.changelog, id
		sp := kmsg.NewFetchResponseTopicPartition()
		sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
		st.Partitions = append(st.Partitions, sp)
		resp.Topics = append(resp.Topics, st)
		n.Add(1)
		return resp, nil, true
	})
	return &n
}

// TestStandbyTailRestartsAfterError: a standby tail that stops on an
// error other than the restore horizon's (here its changelog fetches are
// refused for a while) starts again after a wait, each failure in a row
// counted, and follows the changelog again once the error clears: its
// copy reaches the changelog's end and its lag is reported again. It used
// to stop for good, its lag gauge frozen at its last value.
func TestStandbyTailRestartsAfterError(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("3600000")})
	reg := prometheus.NewRegistry()
	rt, cl := w.standbyRuntime(&skewClock{}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), reg)
	produce := func(kv ...string) int64 {
		if err := cl.ProduceSync(context.Background(), kvRecords(kv...)...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		return w.changelogEnd()
	}
	// caughtUp waits until the tail's copy reflects the changelog up to
	// end and reports its lag.
	caughtUp := func(what string, end int64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			var off, lag int64 = -1, -1
			rt.EachStandbyStatus(func(p int32, o, l int64) { off, lag = o, l })
			v, ok := gaugeValue(t, reg, "meterline_stream_standby_lag_records")
			if off >= end && lag == 0 && ok && v == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the standby copy is at offset %d, lag %d (gauge %v, exported %v) after 15 s; want offset %d, lag 0",
					what, off, lag, v, ok, end)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var refuse atomic.Bool
	refused := refuseChangelogFetches(w, &refuse)
	e0 := produce("k", "v")
	rt.sb.mu.Lock()
	rt.sb.start(0)
	rt.sb.mu.Unlock()
	caughtUp("before the error", e0)

	refuse.Store(true)
	produce("y", "2") // ends the tail's waiting fetch: the next is refused
	deadline := time.Now().Add(15 * time.Second)
	for metricSum(t, reg, "meterline_stream_standby_tail_restarts_total") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the standby tail failed %d fetches but was not restarted twice in 15 s (restarts %v)",
				refused.Load(), metricSum(t, reg, "meterline_stream_standby_tail_restarts_total"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	refuse.Store(false)
	e1 := produce("x", "1", "k", "")
	caughtUp("after the error cleared", e1)
	if _, ok, err := rt.store.Get(0, []byte("x")); err != nil || !ok {
		t.Fatalf("the restarted standby's copy lacks x (err %v)", err)
	}
	if _, ok, err := rt.store.Get(0, []byte("k")); err != nil || ok {
		t.Fatalf("the restarted standby's copy keeps k, deleted (err %v)", err)
	}
}
