package crash

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestCaughtUpIgnoresTicks: a group is caught up when only ticks follow
// its committed offsets, and not while a data record does; LagReport names
// the committed offset and the record left.
func TestCaughtUpIgnoresTicks(t *testing.T) {
	_, brokers := testenv.KFake(t)
	const topic, group = "usage.events", "g"
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Offsets 0 and 1: an event (any record that is not a tick), a tick.
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Key: []byte("event"), Value: schemas.MustEncode(&schemas.Watermark{Watermark: 1})},
		&kgo.Record{Value: schemas.MustEncode(&schemas.Tick{InstanceID: "a"})},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	commit := func(at int64) {
		t.Helper()
		var o kadm.Offsets
		o.AddOffset(topic, 0, at, -1)
		if err := adm.CommitAllOffsets(ctx, group, o); err != nil {
			t.Fatal(err)
		}
	}

	commit(0)
	if ok, err := CaughtUp(brokers, group, topic); err != nil || ok {
		t.Fatalf("committed before the event: CaughtUp = %v, %v; want false", ok, err)
	}
	if rep := LagReport(brokers, group, topic); !strings.Contains(rep, "partition 0: committed 0") || !strings.Contains(rep, `key "event"`) {
		t.Errorf("LagReport does not name the committed offset and the event left:\n%s", rep)
	}
	commit(1)
	if ok, err := CaughtUp(brokers, group, topic); err != nil || !ok {
		t.Fatalf("only a tick after the committed offset: CaughtUp = %v, %v; want true", ok, err)
	}
}
