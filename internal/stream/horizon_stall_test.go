package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
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

// TestRestoreStalledAtOpenTransactionKeepsItsPace: a full restore whose
// copy reads the changelog quickly and then waits at its last stable
// offset, where a previous owner's transaction stays open for longer than
// the restore horizon (100 s of a 54 s horizon), three times in a row, is
// refused (ErrRestoreHorizon): none of those copies read in time. But the
// wait is no slowness. The restore rate kept from those copies is their
// reading pace, so the stage started again once the transaction is gone
// copies (fast) and runs, rather than refusing at once as a full restore
// expected to take 100 s; and the refusal names the open transaction, not
// a delete.retention.ms to set. (A copy that is slow itself is still
// refused at once after a restart: TestFullRestoreOutlastingHorizonIsRefused.)
func TestRestoreStalledAtOpenTransactionKeepsItsPace(t *testing.T) {
	t.Parallel()
	w, clk := rateSampleWorld(t)

	// A previous owner's transactions on the changelog, one at a time,
	// each left open until b's copy waits at it.
	prev, err := kgo.NewClient(kgo.SeedBrokers(w.brokers...), kgo.DefaultProduceTopic(w.changelog),
		kgo.TransactionalID(testenv.Name(t, "previous")), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prev.Close)
	var at atomic.Int64 // the offset of the open transaction's record; -1: none
	at.Store(-1)
	open := func() error {
		if err := prev.BeginTransaction(); err != nil {
			return err
		}
		r, err := prev.ProduceSync(context.Background(), &kgo.Record{Key: []byte("open"), Value: []byte("1")}).First()
		if err != nil {
			return err
		}
		at.Store(r.Offset)
		return nil
	}
	if err := open(); err != nil {
		t.Fatal(err)
	}

	// waiting receives b's fetch of the changelog at the open
	// transaction's offset: its copy read everything before it.
	waiting := make(chan struct{}, 1)
	w.cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			for _, pt := range tp.Partitions {
				if o := at.Load(); o >= 0 && pt.FetchOffset == o && at.CompareAndSwap(o, -1) {
					select {
					case waiting <- struct{}{}:
					default:
					}
				}
			}
		}
		return nil, nil, false
	})
	// While planned holds a channel, a listing of the changelog's offsets
	// (a copy's plan) waits until it is closed: the next copy plans once
	// the next transaction is open.
	var planned atomic.Pointer[chan struct{}]
	w.cluster.ControlKey(kmsg.ListOffsets.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		for _, tp := range req.(*kmsg.ListOffsetsRequest).Topics {
			if ch := planned.Load(); ch != nil && tp.Topic == w.changelog {
				w.cluster.SleepControl(func() { <-*ch })
				break
			}
		}
		return nil, nil, false
	})

	reg := prometheus.NewRegistry()
	errc := make(chan error, 1)
	go func() {
		errc <- func() error {
			for i := 1; i <= maxHorizonAttempts; i++ {
				select {
				case <-waiting:
				case <-time.After(20 * time.Second):
					return fmt.Errorf("copy %d did not reach the open transaction in 20 s", i)
				}
				// The copy has applied what it read and polls at the LSO.
				deadline := time.Now().Add(10 * time.Second)
				for {
					if v, ok := gaugeValue(t, reg, "meterline_stream_restore_remaining_records"); ok && v == 1 {
						break
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("copy %d did not wait at the open transaction in 10 s", i)
					}
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(100 * time.Millisecond)
				clk.skew.Add(int64(100 * time.Second)) // the wait outlasts the horizon
				ch := make(chan struct{})
				if i < maxHorizonAttempts {
					planned.Store(&ch)
				}
				if err := prev.EndTransaction(context.Background(), kgo.TryAbort); err != nil {
					return err
				}
				if i < maxHorizonAttempts {
					if err := open(); err != nil {
						return err
					}
					planned.Store(nil)
					close(ch)
				}
			}
			return nil
		}()
	}()
	w.send("z", "1")
	fsB := vfs.NewMem()
	err = w.runOn("b", fsB, clk, reg)
	if oerr := <-errc; oerr != nil {
		t.Fatal(oerr)
	}
	if !errors.Is(err, ErrRestoreHorizon) {
		t.Fatalf("b's Run: %v; want ErrRestoreHorizon after %d copies that outlasted the horizon", err, maxHorizonAttempts)
	}
	if msg := err.Error(); !strings.Contains(msg, "open transaction") || strings.Contains(msg, "raise delete.retention.ms") {
		t.Errorf("b's refusal does not name the open transaction as the cause, or asks for a longer delete.retention.ms: %v", err)
	}
	expectRestores(t, "b", reg, map[string]float64{"full/no_state": 1, "full/horizon": maxHorizonAttempts - 1, "horizon_exceeded": 1})

	// The transaction is gone. Started again, b copies at its reading
	// pace, inside the horizon, and runs.
	w.send("y", "1")
	reg, err = w.run("b", fsB, clk)
	if err != nil {
		t.Fatalf("b's Run, again, with no transaction open: %v; want it to restore: its copies were fast, they only waited", err)
	}
	expectRestores(t, "b, again", reg, map[string]float64{"full/horizon": 1})
	if got := w.state(fsB); len(got) != minRateSample+2 || got["z"] != "1" || got["y"] != "1" || got["open"] != "" {
		t.Errorf("b's state has %d keys (z=%q y=%q open=%q); want %d, without the aborted transactions' key", len(got), got["z"], got["y"], got["open"], minRateSample+2)
	}
}

// TestReplayStalledAtOpenTransaction: a replay that reads the changelog up
// to a previous owner's open transaction, waits there for longer than the
// horizon, and reads on once the transaction aborts is refused for the
// horizon (it read its last records too late), and its pace counts the
// wait as stalled, not as reading. On kfake; TestRealReplayStalledAtOpenTransaction
// runs it on a real broker, whose fetches report the last stable offset
// the copy tells the wait by.
func TestReplayStalledAtOpenTransaction(t *testing.T) {
	t.Parallel()
	_, brokers := testenv.KFake(t)
	replayStalledAtOpenTransaction(t, brokers)
}

// TestRealReplayStalledAtOpenTransaction: TestReplayStalledAtOpenTransaction
// on the real broker of METERLINE_TEST_KAFKA.
func TestRealReplayStalledAtOpenTransaction(t *testing.T) {
	replayStalledAtOpenTransaction(t, testenv.RealKafka(t))
}

func replayStalledAtOpenTransaction(t *testing.T, brokers []string) {
	ctx := context.Background()
	changelog := testenv.Name(t, "changelog")
	testenv.CreateTopic(t, brokers, changelog, 1, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(changelog))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fillChangelog(t, cl, changelog)
	prev, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(changelog),
		kgo.TransactionalID(testenv.Name(t, "previous")), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close()
	if err := prev.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := prev.ProduceSync(ctx, &kgo.Record{Key: []byte("open"), Value: []byte("1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	clk := &skewClock{}
	reg := prometheus.NewRegistry()
	rp := startReplay(t, brokers, testenv.Name(t, "in"), changelog, cl, clk, reg)
	if rp.cs.lso != minRateSample || rp.cs.end != minRateSample+1 {
		t.Fatalf("listed last stable offset %d and end %d; want %d and %d (the open transaction's record)", rp.cs.lso, rp.cs.end, minRateSample, minRateSample+1)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if v, ok := gaugeValue(t, reg, "meterline_stream_restore_remaining_records"); ok && v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replay did not reach the open transaction in 20 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // it polls at the LSO
	clk.skew.Add(int64(100 * time.Second))
	if err := prev.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	rp.expectWaited(t, "the transaction aborted", minRateSample+1)
}

// fillChangelog writes minRateSample records to changelog with cl,
// enough for a copy to measure the restore rate.
func fillChangelog(t *testing.T, cl *kgo.Client, changelog string) {
	t.Helper()
	recs := make([]*kgo.Record, 0, minRateSample)
	for i := range minRateSample {
		recs = append(recs, &kgo.Record{Topic: changelog, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// replayRun is a full replay of changelog partition 0 on its way.
type replayRun struct {
	cs   copyStart
	done chan error
}

// startReplay plans a full copy of changelog partition 0 (listing it with
// cl) for a runtime on clk and reg, and starts its replay.
func startReplay(t *testing.T, brokers []string, input, changelog string, cl *kgo.Client, clk *skewClock, reg *prometheus.Registry) *replayRun {
	t.Helper()
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: testenv.Name(t, "group"), InstanceID: "r"},
		InputTopic: input, ChangelogTopic: changelog, FS: vfs.NewMem(), Clock: clk,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), Registerer: reg}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cs, err := rt.planCopy(ctx, cl, rt.log, 0, "restore", Checkpoint{}, false)
	if err != nil {
		t.Fatal(err)
	}
	r := &replayRun{cs: cs, done: make(chan error, 1)}
	go func() {
		_, _, err := rt.replay(ctx, 0, cs.from, cs.end, cs.lso, cs.at, cs.retention, nil)
		_ = rt.store.Close()
		r.done <- err
	}()
	return r
}

// expectWaited waits for the replay to end, once the wait (100 s on the
// runtime's clock) has ended (after), and checks that it was refused for
// the horizon with a pace of read offsets, the 100 s stalled, not read.
func (r *replayRun) expectWaited(t *testing.T, after string, read int64) {
	t.Helper()
	var err error
	select {
	case err = <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the replay did not end in 30 s after %s", after)
	}
	var he *horizonError
	if !errors.As(err, &he) {
		t.Fatalf("replay: %v; want a horizon error: it read records 100 s after its date", err)
	}
	t.Logf("pace of the replay: %+v (reading %s)", he.pace, he.pace.reading())
	if he.pace.Read != read || he.pace.Stalled < 100*time.Second || he.pace.reading() > 10*time.Second {
		t.Errorf("pace %+v (reading %s); want %d offsets read, 100 s of it stalled, the reading well under 10 s",
			he.pace, he.pace.reading(), read)
	}
}

// TestReplayThroughBrokerOutage: a replay whose broker stops answering its
// fetches (it closes the connection on each) for longer than the horizon,
// and then answers, is refused for the horizon (it read its records too
// late), and its pace counts the outage as stalled, not as reading.
func TestReplayThroughBrokerOutage(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	fillChangelog(t, w.cl, w.changelog)
	id := w.changelogID()
	var down atomic.Bool
	down.Store(true)
	failed := make(chan struct{}, 1)
	w.cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			if (tp.TopicID == id || tp.Topic == w.changelog) && down.Load() {
				select {
				case failed <- struct{}{}:
				default:
				}
				return nil, errors.New("the broker does not answer"), true
			}
		}
		return nil, nil, false
	})

	clk := &skewClock{}
	rp := startReplay(t, w.brokers, w.input, w.changelog, w.cl, clk, prometheus.NewRegistry())
	select {
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("the replay fetched nothing in 20 s")
	}
	time.Sleep(100 * time.Millisecond)
	clk.skew.Add(int64(100 * time.Second)) // the outage outlasts the horizon
	down.Store(false)
	rp.expectWaited(t, "the broker answered again", minRateSample)
}
