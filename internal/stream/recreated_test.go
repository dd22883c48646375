package stream

import (
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRestoreRefusesRecreatedChangelog: a state directory kept while its
// broker's topics were deleted and created again (a local broker's data
// directory wiped, a new deployment on the same names) is the cache of a
// changelog that no longer exists. When the new changelog has grown past
// the old checkpoint, a restore would replay the new log's tail onto the
// old state, and the group's offset would agree with it: dedup would drop
// new events as copies of ones from the old deployment. The stage refuses
// the directory, naming it, and leaves it as it is.
func TestRestoreRefusesRecreatedChangelog(t *testing.T) {
	t.Parallel()
	w, clk, fsA := ranOnce(t)
	ctx := context.Background()
	adm := kadm.NewClient(w.cl)
	if _, err := adm.DeleteGroup(ctx, w.group); err != nil {
		t.Fatal(err)
	}
	recreate(t, w, w.changelog, w.input)
	w.send("b", "1", "c", "1", "d", "1")
	if _, err := w.run("b", vfs.NewMem(), clk); err != nil {
		t.Fatal(err)
	}
	w.send("e", "1")
	err := w.runWith("a", fsA, clk, prometheus.NewRegistry(), nil)
	if err == nil || !strings.Contains(err.Error(), "deleted and created again") {
		t.Errorf("Run on the state of a deleted changelog: %v; want it refused", err)
	}
	if got := w.state(fsA); len(got) != 1 || got["a"] != "1" {
		t.Errorf("state: %v; want the old state left as it was (a=1 alone)", got)
	}
}

// TestRestoreRefusesRecreatedInput: a state directory kept while the
// stage's input topic was deleted and created again (the changelog kept)
// holds input offsets of a log that no longer exists. On the new log
// those offsets name other records: resumed there (a group whose offsets
// were set to the state's, as the offset mismatch once advised, or a
// broker that kept them), the records below them would never be counted.
// The stage refuses the directory by the input topic's ID, naming the
// topic, and leaves the state as it is.
func TestRestoreRefusesRecreatedInput(t *testing.T) {
	t.Parallel()
	w, clk, fsA := ranOnce(t)
	ctx := context.Background()
	adm := kadm.NewClient(w.cl)
	committed, err := adm.FetchOffsets(ctx, w.group)
	if err != nil {
		t.Fatal(err)
	}
	recreate(t, w, w.input)
	w.send("b", "1", "c", "1")
	// The group's offset set back to the state's on the new topic.
	if _, err := kadm.NewClient(w.cl).CommitOffsets(ctx, w.group, committed.Offsets()); err != nil {
		t.Fatal(err)
	}
	err = w.runWith("a", fsA, clk, prometheus.NewRegistry(), nil)
	if err == nil || !strings.Contains(err.Error(), "deleted and created again") || !strings.Contains(err.Error(), w.input) {
		t.Errorf("Run on the state of a deleted input topic: %v; want it refused, naming %s", err, w.input)
	}
	if got := w.state(fsA); len(got) != 1 || got["a"] != "1" {
		t.Errorf("state: %v; want the old state left as it was (a=1 alone)", got)
	}
}

// recreate deletes topics and creates them again with one partition, and
// gives w a client that knows their new topic IDs.
func recreate(t *testing.T, w *kvWorld, topics ...string) {
	t.Helper()
	if _, err := kadm.NewClient(w.cl).DeleteTopics(context.Background(), topics...); err != nil {
		t.Fatal(err)
	}
	for _, topic := range topics {
		testenv.CreateTopic(t, w.brokers, topic, 1, nil)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.brokers...), kgo.DefaultProduceTopic(w.input))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	w.cl = cl
}
