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
