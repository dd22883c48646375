package stream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// TestAbandonedRestoreLeavesNoRemainingRecords: a restore abandoned
// because its partition was revoked leaves
// meterline_stream_restore_remaining_records of the partition at 0 once
// the instance no longer owns it. The revocation sets it to 0 as it
// cancels the restore, but the restore's goroutine may set it again
// before it sees the cancellation (between two fetches); a value left
// above 0 would read as a restore that never ends, on an instance that no
// longer has the partition (MeterlineRestoreTooLong, docs/operations.md,
// Alerts).
func TestAbandonedRestoreLeavesNoRemainingRecords(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("86400000")})
	fillChangelog(t, w.cl, w.changelog)
	id := w.changelogID()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The changelog's first fetch finds the partition revoked: the
	// restore is cancelled while it has set its gauge to the offsets left.
	w.cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			if tp.TopicID == id || tp.Topic == w.changelog {
				cancel()
				return nil, errors.New("the broker does not answer"), true
			}
		}
		return nil, nil, false
	})
	reg := prometheus.NewRegistry()
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: "r"},
		InputTopic: w.input, ChangelogTopic: w.changelog, FS: vfs.NewMem(),
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), Registerer: reg}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.store.Close() })
	sess, err := kgo.NewGroupTransactSession(kgo.SeedBrokers(w.brokers...), kgo.TransactionalID(testenv.Name(t, "txn")),
		kgo.ConsumerGroup(testenv.Name(t, "other")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sess.Close)
	done := make(chan struct{})
	go func() { defer close(done); rt.restore(ctx, sess, 0, 1, map[string]int64{w.input: 0}, nil) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the restore did not end within 30 s of its cancellation")
	}
	if ctx.Err() == nil {
		t.Fatal("the restore ended without fetching the changelog")
	}
	if v, ok := gaugeValue(t, reg, "meterline_stream_restore_remaining_records"); ok && v != 0 {
		t.Fatalf("restore abandoned, partition not owned: meterline_stream_restore_remaining_records %v, want 0", v)
	}
}
