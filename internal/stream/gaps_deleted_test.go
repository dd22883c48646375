package stream

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// TestForgedDeletedWhileChecked: retention deletes a forged batch (the
// log start moves past it) after the Kafka client read it, and before the
// gap it left is checked. The client dropped the records after the batch,
// which are still in the log; the check cannot read the batch, and must
// not take the rest of the gap for sound: the partition is read again from
// the new log start, and every record in the log is processed once.
func TestForgedDeletedWhileChecked(t *testing.T) {
	s := newSuite(t, nil, nil)
	ctx := context.Background()
	td, err := s.adm.ListTopics(ctx, s.input)
	if err != nil {
		t.Fatal(err)
	}
	id := td[s.input].ID
	want := []string{"i0"}
	s.sendTo(0, "b1", "i0")
	testenv.ProduceBatch(t, s.brokers, s.input, 0, forgedAt(5))
	for i := 1; i <= 6; i++ {
		want = append(want, fmt.Sprintf("i%d", i))
		s.sendTo(0, "b1", want[i])
	}
	// The check's fetch of the gap (offsets 1 to 5) waits until the log
	// start moved past the forged batch.
	var once sync.Once
	fetching, moved := make(chan struct{}), make(chan struct{})
	s.cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		for _, rt := range kreq.(*kmsg.FetchRequest).Topics {
			for _, rp := range rt.Partitions {
				if (rt.TopicID == id || rt.Topic == s.input) && rp.Partition == 0 && rp.FetchOffset == 1 {
					once.Do(func() {
						close(fetching)
						s.cluster.SleepControl(func() { <-moved })
					})
				}
			}
		}
		return nil, nil, false
	})
	s.startProc("a", vfs.NewMem(), &rejectProc{countProc{output: s.output}}, func(c *Config) { c.VerifyInputGaps = true })
	select {
	case <-fetching:
	case <-time.After(30 * time.Second):
		t.Fatal("the gap was not checked in 30 s")
	}
	deleted, err := s.adm.DeleteRecords(ctx, kadm.Offsets{s.input: {0: {Topic: s.input, Partition: 0, At: 2}}})
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	close(moved)
	if rejected := processedOnce(t, s, want); len(rejected) != 0 {
		t.Errorf("rejections %q, want none (the batch is gone)", rejected)
	}
}
