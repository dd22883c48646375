package stream

import (
	"context"
	"go/build"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// The status page reads a Runtime through its Stage interface.
var _ service.Stage = (*Runtime)(nil)

// It reports its standbys and their placement.
var (
	_ service.StandbyStage          = (*Runtime)(nil)
	_ service.StandbyPlacementStage = (*Runtime)(nil)
)

// keepProc keeps every input record as state.
type keepProc struct{}

func (keepProc) Open(int32, *PartitionState) (Partition, error) { return keepPart{}, nil }

type keepPart struct{}

func (keepPart) Process(tx *Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		tx.Put(r.Key, r.Value)
	}
	return nil
}
func (keepPart) Punctuate(*Tx) error { return nil }
func (keepPart) Close()              {}

// TestStatusReportsRestoreAndOwnership holds one partition's restore in
// the middle of its changelog replay (its changelog fetches are stalled on
// kfake) and checks that the Runtime reports it restoring (read as the
// status page reads it, service.StageStatusOf), with the changelog
// records left, while the others are processing; then, once the restore
// ends, that every partition is processing and the list is the group's
// assignment as the broker describes it.
func TestStatusReportsRestoreAndOwnership(t *testing.T) {
	cluster, brokers := testenv.KFake(t)
	input, changelog := testenv.Name(t, "in"), testenv.Name(t, "changelog")
	testenv.CreateTopic(t, brokers, input, 3, nil)
	testenv.CreateTopic(t, brokers, changelog, 3, nil)
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	td, err := adm.ListTopics(ctx, changelog)
	if err != nil {
		t.Fatal(err)
	}
	changelogID := td[changelog].ID

	// Five changelog records on partition 1, from a previous owner: its
	// restore replays them.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 5 {
		r := &kgo.Record{Topic: changelog, Partition: 1, Key: []byte{byte('a' + i)}, Value: []byte("v")}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	// Stall fetches of the changelog (only the restore reads it) until
	// release is closed.
	release := make(chan struct{})
	released := func() bool {
		select {
		case <-release:
			return true
		default:
			return false
		}
	}
	defer func() {
		if !released() {
			close(release)
		}
	}()
	cluster.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			if (tp.Topic == changelog || tp.TopicID == changelogID) && !released() {
				cluster.SleepControl(func() { <-release })
			}
		}
		return nil, nil, false
	})

	group := testenv.Name(t, "group")
	rt, err := New(Config{Stage: "keep",
		Config:     session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: group, InstanceID: "i1", SessionTimeout: 6 * time.Second},
		InputTopic: input, ChangelogTopic: changelog, FS: vfs.NewMem(),
		Logger: zaptest.NewLogger(t), Registerer: prometheus.NewRegistry()}, keepProc{})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Before the group session is up: not joined, nothing assigned.
	st := service.StageStatusOf(rt)
	if st.Stage != "keep" || st.Group != group || st.Instance != "i1" || st.Input != input || st.Joined == nil {
		t.Fatalf("Status identity = %+v", st)
	}

	waitFor := func(what string, cond func(service.StageStatus) bool) service.StageStatus {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			st := service.StageStatusOf(rt)
			if cond(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("Status never showed %s; last: %+v", what, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	states := func(st service.StageStatus) map[int32]string {
		m := map[int32]string{}
		for _, p := range st.Partitions {
			m[p.Partition] = p.State
		}
		return m
	}

	st = waitFor("partition 1 restoring with 5 records left, 0 and 2 processing", func(st service.StageStatus) bool {
		s := states(st)
		return len(st.Partitions) == 3 && s[0] == service.PartitionProcessing && s[2] == service.PartitionProcessing &&
			s[1] == service.PartitionRestoring && st.Partitions[1].RestoreRemaining != nil
	})
	if !*st.Joined || st.Error != "" {
		t.Errorf("joined = %v, error = %q; want joined, no error", *st.Joined, st.Error)
	}
	if got := *st.Partitions[1].RestoreRemaining; got != 5 {
		t.Errorf("partition 1 restore remaining = %d, want 5 (the changelog's records)", got)
	}
	if st.Partitions[0].RestoreRemaining != nil {
		t.Errorf("partition 0 is processing but shows %d records left to restore", *st.Partitions[0].RestoreRemaining)
	}
	if err := rt.Ready(); err == nil {
		t.Error("Ready() = nil while partition 1 restores")
	}

	close(release)
	st = waitFor("every partition processing", func(st service.StageStatus) bool {
		s := states(st)
		return len(s) == 3 && s[0] == service.PartitionProcessing && s[1] == service.PartitionProcessing && s[2] == service.PartitionProcessing
	})
	if err := rt.Ready(); err != nil {
		t.Errorf("Ready() = %v after every restore ended", err)
	}
	var got []int32
	for _, p := range st.Partitions {
		got = append(got, p.Partition)
	}

	// Each partition's restore: partition 1 had changelog records and no
	// state, the others an empty changelog (nothing to replay, no state).
	for _, p := range st.Partitions {
		if p.RestoreKind != "full" || p.RestoreReason != reasonNoState {
			t.Errorf("partition %d: last restore %s (%s), want full (%s)", p.Partition, p.RestoreKind, p.RestoreReason, reasonNoState)
		}
	}

	// The broker's view of the group: this member owns what Status lists.
	assigned := testenv.GroupAssignment(t, adm, group, input)
	if !slices.Equal(got, assigned) {
		t.Errorf("Status lists partitions %v; the broker says the group assigned %v", got, assigned)
	}
}

// TestRuntimeDoesNotImportTheStatusPage: the runtime reports to the status
// page through service.Stage, which it implements without importing
// internal/service (the HTTP side), directly or through another package.
func TestRuntimeDoesNotImportTheStatusPage(t *testing.T) {
	const module = "github.com/meterline/meterline/"
	deps := map[string]bool{}
	var walk func(path, dir string)
	walk = func(path, dir string) {
		pkg, err := build.Import(path, dir, 0)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		for _, imp := range pkg.Imports {
			if strings.HasPrefix(imp, module) && !deps[imp] {
				deps[imp] = true
				walk(imp, pkg.Dir)
			}
		}
	}
	walk(".", ".")
	if len(deps) == 0 {
		t.Fatal("found no dependency of the runtime inside the module; the walk is broken")
	}
	if deps[module+"internal/service"] {
		t.Errorf("internal/stream depends on internal/service (the status page): %v", slices.Sorted(maps.Keys(deps)))
	}
}
