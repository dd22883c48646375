package dedup

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/testenv"
)

// TestAbortedTransactionCountsOnce: docs/operations.md, Health, metrics and
// logs, lists records accepted, duplicates and rejections by reason, and
// the state's key count. A transaction that aborts (here: its offset commit
// refused) is processed again from the committed state; each record is then
// counted once, as the outputs are (the counts are added when a transaction
// commits, dropped when it aborts), and the key count is the state's (Abort
// takes back the keys the transaction added). So do the runtime's records
// in and out, and its time records in: the ticks among the records in.
func TestAbortedTransactionCountsOnce(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newHarness(t, brokers, 1)
	reg := prometheus.NewRegistry()
	arr := t0 + 10*day
	testenv.FailNextTxnOffsetCommit(c)
	h.produce(
		h.event("acme", "api_calls", "a1", 1, arr-hour, arr),
		h.event("acme", "api_calls", "a1", 1, arr-hour, arr+1),    // exact copy
		h.event("acme", "api_calls", "old", 1, arr-40*day, arr+2), // too_old
		h.tick(0, arr+3),
	)
	st := h.start(h.configWith("a", reg))
	h.caughtUp()
	if got := metricValues(t, reg, "meterline_stream_transactions_total")["outcome=aborted,stage=dedup"]; got < 1 {
		t.Fatalf("no aborted transaction (%v): the test did not test anything", metricValues(t, reg, "meterline_stream_transactions_total"))
	}
	if err, done := st.wait(0); done {
		t.Fatalf("dedup stopped: %v", err)
	}
	o := h.outputs()
	if n := len(o.dedupedOf("a1")); n != 1 || len(o.duplicates) != 1 || len(o.rejectedOf("old")) != 1 {
		t.Fatalf("outputs: a1 forwarded %d, %d duplicates, old rejected %d; want 1, 1, 1", n, len(o.duplicates), len(o.rejectedOf("old")))
	}
	if got := metricSum(t, reg, "meterline_dedup_accepted_total"); got != 1 {
		t.Errorf("meterline_dedup_accepted_total = %v, want 1 (one event accepted)", got)
	}
	if got := metricSum(t, reg, "meterline_dedup_duplicates_total"); got != 1 {
		t.Errorf("meterline_dedup_duplicates_total = %v, want 1 (one copy in usage.duplicates)", got)
	}
	if got := metricValues(t, reg, "meterline_rejected_total")["reason=too_old,stage=dedup"]; got != 1 {
		t.Errorf("meterline_rejected_total{stage=dedup,reason=too_old} = %v, want 1 (one record in usage.rejected)", got)
	}
	if got, want := metricSum(t, reg, "meterline_dedup_state_keys"), float64(identityKeys(t, st.stage, 0)); got != want {
		t.Errorf("meterline_dedup_state_keys = %v, the state holds %v identity keys", got, want)
	}
	// The runtime's records in and out count committed transactions only:
	// after a stop (an open transaction is aborted), the records out of
	// each topic are those the topic holds (read_committed) besides the
	// test's, and no input record counts twice.
	if err := st.stop(); err != nil {
		t.Fatal(err)
	}
	out := metricValues(t, reg, "meterline_stream_records_out_total")
	for topic, want := range map[string]int{
		h.names.DuplicatesTopic(): 1,
		h.names.RejectedTopic():   1,
		h.names.EventsTopic():     len(testenv.ReadAll(t, h.brokers, h.names.EventsTopic())) - 4, // its own ticks, not the test's 4 records
	} {
		if got := out["stage=dedup,topic="+topic]; got != float64(want) {
			t.Errorf("meterline_stream_records_out_total{topic=%s} = %v, want %d", topic, got, want)
		}
	}
	inKey := "stage=dedup,topic=" + h.names.EventsTopic()
	in := metricValues(t, reg, "meterline_stream_records_in_total")[inKey]
	if all := len(testenv.ReadAll(t, h.brokers, h.names.EventsTopic())); in < 4 || in > float64(all) {
		t.Errorf("meterline_stream_records_in_total{topic=events} = %v, want at least the 3 events and the tick, at most the topic's %d records", in, all)
	}
	// The ticks among them are time records (docs/operations.md,
	// MeterlineRejectionSpike): the records in less these are the events.
	ticks := metricValues(t, reg, "meterline_stream_time_records_in_total")[inKey]
	if ticks < 1 || in-ticks != 3 {
		t.Errorf("meterline_stream_time_records_in_total{topic=events} = %v of %v records in, want all but the 3 events", ticks, in)
	}
}
