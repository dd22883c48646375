package stream

import (
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
)

// TestStateDirCachesOneChangelog: a state directory is the cache of one
// changelog topic. Opened for another (a topic prefix or changelog name
// changed, another pipeline's directory given), its checkpoints are
// offsets of a log they were never read from: a restore would replay the
// other log's tail onto this state, and dedup would drop events as copies
// of events it never saw. New refuses, naming both topics and the way
// out; the directory still opens for its own changelog.
func TestStateDirCachesOneChangelog(t *testing.T) {
	fs := vfs.NewMem()
	open := func(changelog string) error {
		rt, err := New(Config{Stage: "bind",
			Config:     session.Config{Kafka: kafka.Config{Brokers: []string{"127.0.0.1:1"}}, Group: "g", InstanceID: "i1"},
			InputTopic: "in", ChangelogTopic: changelog, StateDir: "state", FS: fs,
			Logger: zaptest.NewLogger(t), Registerer: prometheus.NewRegistry()}, keepProc{})
		if err != nil {
			return err
		}
		return rt.store.Close()
	}
	if err := open("prod.changelog"); err != nil {
		t.Fatalf("first open: %v", err)
	}
	err := open("try.changelog")
	if err == nil {
		t.Fatal("opened the state of prod.changelog as the cache of try.changelog")
	}
	for _, want := range []string{`"prod.changelog"`, `"try.changelog"`, "--state-dir", "delete"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if err := open("prod.changelog"); err != nil {
		t.Fatalf("open for its own changelog again: %v", err)
	}
}
