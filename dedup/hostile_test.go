package dedup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// Tests of what a hostile or careless producer can send (docs/design.md,
// Event identity and keys; docs/design.md, Time; docs/design.md, Bad input;
// docs/operations.md, Dedup keys), each on kfake and, where Kafka's
// behaviour matters, on the real broker of METERLINE_TEST_KAFKA.

// onBrokers runs fn on kfake, then on the real broker (skipped, saying so,
// without METERLINE_TEST_KAFKA or with -short).
func onBrokers(t *testing.T, fn func(t *testing.T, brokers []string)) {
	t.Run("kfake", func(t *testing.T) { fn(t, nil) })
	t.Run("kafka", func(t *testing.T) { fn(t, testenv.RealKafka(t)) })
}

// within polls cond every 100 ms until it holds, and fails the test
// saying what did not happen when it does not hold within d.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// changelogEnd returns the end offset of partition 0 of topic.
func changelogEnd(ctx context.Context, t *testing.T, adm *kadm.Client, topic string) int64 {
	t.Helper()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, 0)
	return end.Offset
}

// deleteChangelogBelow deletes partition 0 of topic below offset, as its
// retention would.
func deleteChangelogBelow(ctx context.Context, t *testing.T, adm *kadm.Client, topic string, offset int64) {
	t.Helper()
	var del kadm.Offsets
	del.AddOffset(topic, 0, offset, -1)
	if _, err := adm.DeleteRecords(ctx, del); err != nil {
		t.Fatal(err)
	}
}

// metricValues returns the values of a metric family by label set
// ("name=value,..."; "" for none); a histogram's is its observation
// count.
func metricValues(t testing.TB, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			out[strings.Join(ls, ",")] = v
		}
	}
	return out
}

func metricSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	s := 0.0
	for _, v := range metricValues(t, reg, name) {
		s += v
	}
	return s
}

// forgedHeaders are dedup's re-route headers as a producer could write
// them: the original's coordinates and an arrival of its choosing, and
// optionally a signature header it made up.
func forgedHeaders(arrival int64, auth string) []kgo.RecordHeader {
	hs := []kgo.RecordHeader{
		{Key: HeaderRerouted, Value: []byte("0/0")},
		{Key: HeaderArrival, Value: []byte(fmt.Sprint(arrival))},
	}
	if auth != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderAuth, Value: []byte(auth)})
	}
	return hs
}

// startWatched starts instance "a" on a new harness of n partitions,
// with a registry of its own for the test to read its metrics.
func startWatched(t *testing.T, brokers []string, n int32) (*harness, *prometheus.Registry) {
	h := newHarness(t, brokers, n)
	reg := prometheus.NewRegistry()
	h.start(h.configWith("a", reg))
	return h, reg
}

// madeUpAuth is a well-formed signature header under the harness's key ID
// that no key made.
var madeUpAuth = "v1:test-1:" + base64.RawURLEncoding.EncodeToString(make([]byte, sha256.Size))

// watermarksOf returns the watermarks forwarded for source partition p.
func watermarksOf(o outputs, p int32) []int64 {
	var out []int64
	for _, w := range o.watermarks {
		if w.SourcePartition == p {
			out = append(out, w.Watermark)
		}
	}
	return out
}

func (h *harness) configWith(instance string, reg *prometheus.Registry) Config {
	cfg := h.config(instance, vfs.NewMem())
	cfg.TickInterval = time.Hour // only the test's ticks
	cfg.Stream.Registerer = reg
	return cfg
}

func (o outputs) rejectedOf(id string) []*schemas.Rejected {
	var out []*schemas.Rejected
	for _, r := range o.rejected {
		if r.EventID == id {
			out = append(out, r)
		}
	}
	return out
}

func (o outputs) dedupedOf(id string) []*schemas.DedupedEvent {
	var out []*schemas.DedupedEvent
	for _, d := range o.deduped {
		if d.EventID == id {
			out = append(out, d)
		}
	}
	return out
}

// TestForgedHeaders: a producer's re-route headers, on a valid event and
// on an undecodable record, change nothing. The watermark stays the
// largest broker timestamp, so no key expires and a normal retry after the
// attack is still dropped as a copy; the forged event's arrival is its
// broker timestamp; a 200-day-old event with forged headers is too_old.
// Each forged record is counted.
func TestForgedHeaders(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 1)
		reg := prometheus.NewRegistry()
		st := h.start(h.configWith("a", reg))
		arr := t0 + 10*day
		far := arr + 200*day // the arrival the attacker claims
		e1 := h.event("acme", "api_calls", "e1", 1, arr-hour, arr)
		h.produce(e1)
		h.caughtUp()

		f1 := h.event("acme", "api_calls", "f1", 1, arr-hour, arr+500)
		f1.Headers = forgedHeaders(far, "")
		bad := &kgo.Record{Topic: h.names.EventsTopic(), Partition: 0, Key: []byte("x"), Value: []byte("not avro"),
			Timestamp: time.UnixMilli(arr + 600), Headers: forgedHeaders(far, madeUpAuth)}
		old := h.event("acme", "api_calls", "old1", 1, arr-200*day, arr+700)
		old.Headers = forgedHeaders(arr-200*day+hour, madeUpAuth)
		h.produce(f1, bad, old, h.tick(0, arr+3000))
		retry := h.event("acme", "api_calls", "e1", 1, arr-hour, arr+4000)
		h.produce(retry, h.tick(0, arr+5000))
		h.caughtUp()
		o := h.outputs()

		if n := len(o.dedupedOf("e1")); n != 1 {
			t.Errorf("e1 forwarded %d times, want 1: the forged arrival expired its key", n)
		}
		if len(o.duplicates) != 1 || o.duplicates[0].EventID != "e1" || o.duplicates[0].OriginalArrival != arr {
			t.Errorf("duplicates %+v, want the retry of e1", o.duplicates)
		}
		if d := o.dedupedOf("f1"); len(d) != 1 || d[0].IngestTime != arr+500 {
			t.Errorf("f1: %+v, want one with ingest_time %d (its broker timestamp)", d, arr+500)
		}
		if r := o.rejectedOf("old1"); len(r) != 1 || r[0].Reason != schemas.ReasonTooOld {
			t.Errorf("old1: rejected %+v, want too_old", r)
		}
		if len(o.dedupedOf("old1")) != 0 {
			t.Error("a 200-day-old event went through with forged headers")
		}
		for _, w := range watermarksOf(o, 0) {
			if w > arr+5000 {
				t.Errorf("watermark %d beyond the largest broker timestamp %d", w, arr+5000)
			}
		}
		if n := identityKeys(t, st.stage, 0); n != 2 {
			t.Errorf("%d identity keys, want 2 (e1, f1)", n)
		}
		if got := metricSum(t, reg, "meterline_dedup_forged_headers_total"); got != 3 {
			t.Errorf("meterline_dedup_forged_headers_total = %v, want 3", got)
		}
	})
}

// TestGenuineRerouteAndReplay: a record dedup re-routes keeps its original
// arrival; its headers, captured and replayed onto another record or onto
// the same record in another partition, prove nothing.
func TestGenuineRerouteAndReplay(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h, reg := startWatched(t, brokers, 2)
		arr := t0 + 10*day
		m := h.event("acme", "api_calls", "m1", 1, arr-hour, arr)
		m.Partition = 1 - m.Partition // misrouted
		h.produce(m)
		h.caughtUp()
		var genuine *kgo.Record
		for _, r := range readEvents(t, h) {
			if len(r.Headers) > 0 && bytes.Equal(r.Key, schemas.AppendFramed(nil, "acme", "api_calls", "m1")) {
				genuine = r
			}
		}
		if genuine == nil {
			t.Fatal("no re-routed record in usage.events")
		}
		if d := h.outputs().dedupedOf("m1"); len(d) != 1 || d[0].IngestTime != arr {
			t.Fatalf("re-routed m1: %+v, want one with ingest_time %d (the original arrival)", d, arr)
		}

		// Another event, 39 days old at its own arrival 9 days after arr:
		// too_old by its own arrival, accepted by the captured one.
		// (Broker timestamps stay in the past: a broker refuses CreateTime
		// more than an hour ahead.)
		y := h.event("acme", "api_calls", "y1", 1, arr-30*day, arr+9*day)
		y.Headers = genuine.Headers
		// The genuine record, replayed to the other partition.
		elsewhere := &kgo.Record{Topic: h.names.EventsTopic(), Partition: 1 - genuine.Partition, Key: genuine.Key,
			Value: genuine.Value, Headers: genuine.Headers, Timestamp: time.UnixMilli(arr + 9*day + 1000)}
		h.produce(y, elsewhere)
		h.caughtUp()
		o := h.outputs()
		if r := o.rejectedOf("y1"); len(r) != 1 || r[0].Reason != schemas.ReasonTooOld {
			t.Errorf("y1 with captured headers: rejected %+v, want too_old", r)
		}
		if n := len(o.dedupedOf("m1")); n != 1 {
			t.Errorf("m1 forwarded %d times, want 1", n)
		}
		// The replay elsewhere is misrouted: re-routed with its own
		// arrival, then a copy of m1.
		var dup *schemas.Duplicate
		for _, d := range o.duplicates {
			if d.EventID == "m1" {
				dup = d
			}
		}
		if dup == nil || dup.DuplicateArrival != arr+9*day+1000 {
			t.Errorf("replayed m1: duplicate %+v, want one arriving at %d", dup, arr+9*day+1000)
		}
		if got := metricSum(t, reg, "meterline_dedup_forged_headers_total"); got != 2 {
			t.Errorf("meterline_dedup_forged_headers_total = %v, want 2", got)
		}
	})
}

// TestKeyRotation: a record re-routed under a key that was then rotated
// out of signing, and kept in the ring to verify, keeps its arrival; the
// new key signs. A ring without the old key treats the record as an
// ordinary one (which is why a retired key is kept for the retention of
// the events topic, and why dedup refuses a ring without a key its state
// saw sign within it, TestRetiredKeyStillNeeded; the state here is new and
// records no key).
func TestKeyRotation(t *testing.T) {
	arr := t0 + 10*day
	for _, c := range []struct {
		name string
		keep bool // the in-flight record keeps its arrival
	}{{"rotated", true}, {"retired too early", false}} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil, 2)
			oldKey := h.keys[0]
			newKey, err := GenerateKey("test-2")
			if err != nil {
				t.Fatal(err)
			}
			// In flight: re-routed by an instance that signed with the old
			// key, not yet read when every instance moves to the new ring.
			inflight := h.event("acme", "api_calls", "rot1", 1, arr-hour, arr+day)
			inflight.Headers = newKeyring([]Key{oldKey}).rerouteHeaders(h.names.EventsTopic(), inflight.Partition,
				inflight.Key, inflight.Value, rerouted{origPartition: 1 - inflight.Partition, origOffset: 7, arrival: arr})
			misrouted := h.event("acme", "api_calls", "rot2", 1, arr-hour, arr)
			misrouted.Partition = 1 - misrouted.Partition
			h.produce(inflight, misrouted)
			h.keys = []Key{newKey, oldKey}
			if !c.keep {
				h.keys = []Key{newKey}
			}
			reg := prometheus.NewRegistry()
			h.start(h.configWith("a", reg))
			h.caughtUp()
			o := h.outputs()
			d := o.dedupedOf("rot1")
			forged := metricSum(t, reg, "meterline_dedup_forged_headers_total")
			switch {
			case len(d) != 1:
				t.Fatalf("rot1 forwarded %d times, want 1", len(d))
			case c.keep && (d[0].IngestTime != arr || forged != 0):
				t.Errorf("after rotation: ingest_time %d (want %d), %v forged", d[0].IngestTime, arr, forged)
			case !c.keep && (d[0].IngestTime != arr+day || forged != 1):
				t.Errorf("with the old key gone: ingest_time %d, %v forged; want %d and 1", d[0].IngestTime, forged, arr+day)
			}
			if d := o.dedupedOf("rot2"); len(d) != 1 || d[0].IngestTime != arr {
				t.Errorf("re-routed under the new key: %+v, want ingest_time %d", d, arr)
			}
			for _, r := range readEvents(t, h) {
				for _, hd := range r.Headers {
					if hd.Key == HeaderAuth && bytes.Equal(r.Key, schemas.AppendFramed(nil, "acme", "api_calls", "rot2")) &&
						!bytes.HasPrefix(hd.Value, []byte("v1:test-2:")) {
						t.Errorf("re-routed after the rotation with %q, want the new key", hd.Value)
					}
				}
			}
		})
	}
}

// TestUpgradeOffset: records re-routed before dedup signed its headers are
// honoured only below the upgrade offset, recorded when a partition of an
// older state first runs with signatures; a partition with new state
// honours none.
func TestUpgradeOffset(t *testing.T) {
	arr := t0 + 10*day
	legacy := func(h *harness, id string, ts int64) *kgo.Record {
		r := h.event("acme", "api_calls", id, 1, arr-hour, ts)
		r.Headers = forgedHeaders(arr, "") // as b9acd11 wrote them
		return r
	}
	t.Run("older state", func(t *testing.T) {
		h := newHarness(t, nil, 1)
		// The changelog of a version that did not sign: the partition count
		// only.
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], 1)
		// (The key scheme, which no such version wrote, is there so that
		// this test reaches the upgrade offset: without it dedup refuses
		// the state, TestKeySchemeRefused.)
		h.produce(&kgo.Record{Topic: h.names.DedupChangelogTopic(), Partition: 0, Key: keyPartitions, Value: n[:]},
			&kgo.Record{Topic: h.names.DedupChangelogTopic(), Partition: 0, Key: keyKeyScheme, Value: []byte(schemas.DedupedKeyScheme)})
		h.produce(legacy(h, "before", arr+day)) // offset 0, in flight at the upgrade
		reg := prometheus.NewRegistry()
		h.start(h.configWith("a", reg))
		h.caughtUp()
		h.produce(legacy(h, "after", arr+day)) // offset 1: must be signed
		h.caughtUp()
		o := h.outputs()
		if d := o.dedupedOf("before"); len(d) != 1 || d[0].IngestTime != arr {
			t.Errorf("below the upgrade offset: %+v, want ingest_time %d", d, arr)
		}
		if d := o.dedupedOf("after"); len(d) != 1 || d[0].IngestTime != arr+day {
			t.Errorf("at the upgrade offset: %+v, want ingest_time %d (its broker timestamp)", d, arr+day)
		}
		if got := metricSum(t, reg, "meterline_dedup_forged_headers_total"); got != 1 {
			t.Errorf("forged %v, want 1", got)
		}
		found := false
		for _, r := range readTopic(t, h, h.names.DedupChangelogTopic()) {
			if bytes.Equal(r.Key, keyUpgrade) && len(r.Value) == 8 && binary.BigEndian.Uint64(r.Value) == 1 {
				found = true
			}
		}
		if !found {
			t.Error("upgrade offset 1 not in the changelog")
		}
	})
	t.Run("new state", func(t *testing.T) {
		h := newHarness(t, nil, 1)
		h.produce(legacy(h, "before", arr+day))
		h.start(h.configWith("a", prometheus.NewRegistry()))
		h.caughtUp()
		if d := h.outputs().dedupedOf("before"); len(d) != 1 || d[0].IngestTime != arr+day {
			t.Errorf("unsigned headers on new state: %+v, want ingest_time %d", d, arr+day)
		}
	})
}

// TestTicks: a producer's unsigned ticks forward no watermark and are
// counted, and each is logged with its partition, offset and the instance
// it names (the runbook's way to the writer: a producer, or a dedup
// instance with another key ring); signed ticks (replayed, or a flood)
// forward at most one watermark per WatermarkEvery of broker time. Every
// tick's broker timestamp still advances the watermark.
func TestTicks(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 2)
		reg := prometheus.NewRegistry()
		cfg := h.configWith("a", reg)
		cfg.WatermarkEvery = time.Second
		var logs testenv.SyncBuffer
		cfg.Stream.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&logs), zap.InfoLevel))
		h.start(cfg)
		arr := t0 + 10*day
		var recs []*kgo.Record
		for i := int64(0); i < 50; i++ {
			tk := h.tick(0, arr+i)
			tk.Headers = nil
			tk.Value = schemas.MustEncode(&schemas.Tick{InstanceID: "intruder"})
			recs = append(recs, tk)
		}
		for i := int64(0); i < 50; i++ {
			recs = append(recs, h.tick(0, arr+1000+i))
		}
		recs = append(recs, h.tick(0, arr+2000))
		h.produce(recs...)
		h.caughtUp()
		o := h.outputs()
		w := watermarksOf(o, 0)
		// Two forwards, each to both usage.deduped partitions.
		if len(w) != 4 || w[0] != arr+1000 || w[3] != arr+2000 {
			t.Errorf("watermarks %v, want [%d %d %d %d]", w, arr+1000, arr+1000, arr+2000, arr+2000)
		}
		if got := metricSum(t, reg, "meterline_dedup_unauthenticated_ticks_total"); got != 50 {
			t.Errorf("unauthenticated ticks %v, want 50", got)
		}
		if got := metricSum(t, reg, "meterline_dedup_ticks_throttled_total"); got != 49 {
			t.Errorf("throttled ticks %v, want 49", got)
		}
		var unsigned []map[string]any
		for _, line := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "tick not authenticated; it forwards no watermark" {
				unsigned = append(unsigned, m)
			}
		}
		if len(unsigned) != 50 {
			t.Fatalf("%d log lines of unauthenticated ticks, want 50", len(unsigned))
		}
		if m := unsigned[0]; m["partition"] != 0.0 || m["offset"] == nil || m["tick_instance"] != "intruder" || m["why"] == "" {
			t.Errorf("log line %v, want partition 0, the offset, why and tick_instance intruder", m)
		}
	})
}

// TestCountersAtZeroFromStart: before any record, dedup exports its
// rejections for every reason it can give, and its first copies and
// copies for every source label, at 0. A series born at its first
// increment hides that increment from rate() and increase(): a single
// burst of rejections or copies would fire no alert
// (MeterlineRejectionSpike, MeterlineDuplicateSpike) and show on no panel.
func TestCountersAtZeroFromStart(t *testing.T) {
	h := newHarness(t, nil, 2)
	reg := prometheus.NewRegistry()
	cfg := h.configWith("a", reg)
	cfg.Sources = []string{"src-1"}
	h.start(cfg)
	rej := metricValues(t, reg, "meterline_rejected_total")
	for _, r := range []string{schemas.ReasonUndecodable, schemas.ReasonUnknownSchema, schemas.ReasonInvalid,
		schemas.ReasonOversized, schemas.ReasonTooOld, schemas.ReasonInFuture} {
		if v, ok := rej["reason="+r+",stage=dedup"]; !ok || v != 0 {
			t.Errorf("meterline_rejected_total{stage=dedup,reason=%s} = %v (present %v), want 0", r, v, ok)
		}
	}
	acc, dup := metricValues(t, reg, "meterline_dedup_accepted_total"), metricValues(t, reg, "meterline_dedup_duplicates_total")
	for _, s := range []string{"src-1", OtherSource} {
		if v, ok := acc["source="+s]; !ok || v != 0 {
			t.Errorf("meterline_dedup_accepted_total{source=%s} = %v (present %v), want 0", s, v, ok)
		}
		for _, c := range []string{"false", "true"} {
			if v, ok := dup["conflict="+c+",source="+s]; !ok || v != 0 {
				t.Errorf("meterline_dedup_duplicates_total{source=%s,conflict=%s} = %v (present %v), want 0", s, c, v, ok)
			}
		}
	}
}

// TestSourceLabelsBounded: 20,000 distinct sources make at most the
// configured sources plus "other" series (docs/operations.md, Dedup keys).
func TestSourceLabelsBounded(t *testing.T) {
	h := newHarness(t, nil, 4)
	reg := prometheus.NewRegistry()
	cfg := h.configWith("a", reg)
	cfg.Sources = []string{"src-1", "src-2"}
	h.start(cfg)
	arr := t0 + 10*day
	var recs []*kgo.Record
	for i := 0; i < 20000; i++ {
		e := &schemas.UsageEvent{EventID: fmt.Sprint("s", i), CustomerID: "acme", Meter: "api_calls", Quantity: 1,
			EventTime: arr - hour, Source: fmt.Sprint("src-", i)}
		key := e.Identity().Key()
		r := &kgo.Record{Topic: h.names.EventsTopic(), Partition: schemas.Partition(key, h.n), Key: key,
			Value: schemas.MustEncode(e), Timestamp: time.UnixMilli(arr)}
		recs = append(recs, r)
		if i < 100 {
			c := *r
			c.Timestamp = time.UnixMilli(arr + 1000)
			recs = append(recs, &c)
		}
	}
	h.produce(recs...)
	h.caughtUp()
	acc := metricValues(t, reg, "meterline_dedup_accepted_total")
	if len(acc) > 3 || acc["source=src-1"] != 1 || acc["source=src-2"] != 1 || acc["source=other"] != 19998 {
		t.Errorf("accepted series: %d, want src-1, src-2 and other (values %v)", len(acc), limit(acc))
	}
	dup := metricValues(t, reg, "meterline_dedup_duplicates_total")
	if len(dup) > 3*2 || metricSum(t, reg, "meterline_dedup_duplicates_total") != 100 {
		t.Errorf("duplicate series: %d, want at most 6 (values %v)", len(dup), limit(dup))
	}
}

// limit keeps a few entries of a map for a message.
func limit(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if len(out) == 5 {
			break
		}
		out[k] = v
	}
	return out
}

// TestPoisonRecord: a legal record of ~900 KiB (a 400 KiB key, a 500 KiB
// value) is rejected with a bounded Rejected record (prefixes, whole
// lengths, digests) that the broker accepts, and the partition goes on: no
// crash loop (docs/design.md, Bad input). On the real broker with its
// default message.max.bytes.
func TestPoisonRecord(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 1)
		st := h.start(h.configWith("a", prometheus.NewRegistry()))
		arr := t0 + 10*day
		key := bytes.Repeat([]byte("k"), 400<<10)
		val := bytes.Repeat([]byte("v"), 500<<10)
		r := rejectedBeforeEvent(t, h, st, &kgo.Record{Topic: h.names.EventsTopic(), Partition: 0, Key: key, Value: val, Timestamp: time.UnixMilli(arr)})
		ks, vs := sha256.Sum256(key), sha256.Sum256(val)
		if r.Reason != schemas.ReasonOversized || r.RawKeyLength != int64(len(key)) || r.RawValueLength != int64(len(val)) ||
			!bytes.Equal(r.RawKeySHA256, ks[:]) || !bytes.Equal(r.RawValueSHA256, vs[:]) ||
			len(r.RawKey) > schemas.MaxRejectedRawBytes || len(r.RawValue) > schemas.MaxRejectedRawBytes {
			t.Errorf("rejected record not bounded as specified: reason %s, key %d/%d bytes, value %d/%d bytes",
				r.Reason, len(r.RawKey), r.RawKeyLength, len(r.RawValue), r.RawValueLength)
		}
		for _, rec := range readTopic(t, h, h.names.RejectedTopic()) {
			if n := len(rec.Key) + len(rec.Value); n > schemas.MaxRejectedBytes {
				t.Errorf("rejected record of %d bytes", n)
			}
		}
	})
}

// rejectedBeforeEvent produces rec, then an event that arrives 1 ms after
// it, and returns the one rejection dedup made of rec. It fails the test
// unless dedup still runs, forwarded the event, and rejected one record.
func rejectedBeforeEvent(t *testing.T, h *harness, st *running, rec *kgo.Record) *schemas.Rejected {
	t.Helper()
	arr := rec.Timestamp.UnixMilli()
	h.produce(rec)
	h.produce(h.event("acme", "api_calls", "after", 1, arr-hour, arr+1))
	h.caughtUp()
	if err, done := st.wait(0); done {
		t.Fatalf("dedup stopped: %v", err)
	}
	o := h.outputs()
	if len(o.dedupedOf("after")) != 1 {
		t.Error("the event after the rejected record was not forwarded")
	}
	if len(o.rejected) != 1 {
		t.Fatalf("%d rejected records, want 1", len(o.rejected))
	}
	return o.rejected[0]
}

// TestAbortedTransactionRewritesMetadata: the first transaction carries
// the partition count (and the upgrade offset); when it aborts and the
// partition stays, the next transaction carries them again (docs/design.md,
// Event identity and keys).
func TestAbortedTransactionRewritesMetadata(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newHarness(t, brokers, 1)
	arr := t0 + 10*day
	h.produce(h.event("acme", "api_calls", "a1", 1, arr-hour, arr))
	testenv.FailNextTxnOffsetCommit(c)
	reg := prometheus.NewRegistry()
	st := h.start(h.configWith("a", reg))
	h.caughtUp()
	if got := metricValues(t, reg, "meterline_stream_transactions_total")["outcome=aborted,stage=dedup"]; got < 1 {
		t.Fatalf("no aborted transaction (%v): the test did not test anything", metricValues(t, reg, "meterline_stream_transactions_total"))
	}
	if err, done := st.wait(0); done {
		t.Fatalf("dedup stopped: %v", err)
	}
	var n, u, k bool
	for _, r := range readTopic(t, h, h.names.DedupChangelogTopic()) {
		n = n || bytes.Equal(r.Key, keyPartitions)
		u = u || bytes.Equal(r.Key, keyUpgrade)
		k = k || bytes.Equal(r.Key, keyKeyScheme)
	}
	if !n || !u || !k {
		t.Errorf("after an aborted first transaction the changelog has the partition count: %v, the upgrade offset: %v, the key scheme: %v", n, u, k)
	}
}

// TestMetadataOutlivesRetention: the changelog's retention deletes old
// records, but the partition count, the upgrade offset and the watermark
// are written again with each bucket expiry, so a restore after the first
// records are gone still refuses a changed partition count.
func TestMetadataOutlivesRetention(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 1)
		cfg := h.configWith("a", prometheus.NewRegistry())
		cfg.Window, cfg.Skew, cfg.Bucket = 2*time.Hour, time.Minute, time.Minute
		a := h.start(cfg)
		arr := t0 + 10*day
		h.produce(h.event("acme", "api_calls", "r1", 1, arr-hour, arr))
		h.caughtUp()
		adm := testenv.Admin(t, h.brokers)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		first := changelogEnd(ctx, t, adm, h.names.DedupChangelogTopic())
		// Ten minutes of broker time later (ten buckets expire).
		h.produce(h.tick(0, arr+10*60_000))
		h.caughtUp()
		// The expiry goes out in transactions of its own after the input
		// that decided it: wait until it rewrote the partition count past
		// the records retention will remove.
		within(t, 30*time.Second, "the bucket expiry rewrote the partition count", func() bool {
			return metadataAtOrAfter(t, h.brokers, h.names.DedupChangelogTopic(), first)
		})
		if err := a.stop(); err != nil {
			t.Fatal(err)
		}
		// Retention removes everything written in the first minutes.
		deleteChangelogBelow(ctx, t, adm, h.names.DedupChangelogTopic(), first)
		if _, err := adm.CreatePartitions(ctx, 1, h.names.EventsTopic(), h.names.DedupChangelogTopic()); err != nil {
			t.Fatal(err)
		}
		b := h.start(h.config("b", vfs.NewMem())) // a full restore from what is left
		err, ok := b.wait(30 * time.Second)
		if !ok {
			t.Fatal("dedup runs on a changed partition count: the partition count was lost to retention")
		}
		if !errors.Is(err, ErrPartitionCountChanged) {
			t.Fatalf("Run = %v, want ErrPartitionCountChanged", err)
		}
	})
}

// metadataAtOrAfter reports whether partition 0 of the changelog holds the
// partition count at an offset from off on.
func metadataAtOrAfter(t *testing.T, brokers []string, changelog string, off int64) bool {
	for _, r := range testenv.ReadAll(t, brokers, changelog) {
		if r.Partition == 0 && r.Offset >= off && bytes.Equal(r.Key, keyPartitions) {
			return true
		}
	}
	return false
}

// TestSecretNeverShown: a key's secret appears in no log line of a run that
// signs, verifies and rejects forged headers (debug level, kgo included),
// and not in a formatted or JSON-encoded configuration.
func TestSecretNeverShown(t *testing.T) {
	h := newHarness(t, nil, 2)
	var logs testenv.SyncBuffer
	cfg := h.configWith("a", prometheus.NewRegistry())
	cfg.Stream.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(&logs), zap.DebugLevel))
	h.start(cfg)
	arr := t0 + 10*day
	m := h.event("acme", "api_calls", "s1", 1, arr-hour, arr)
	m.Partition = 1 - m.Partition
	f := h.event("acme", "api_calls", "s2", 1, arr-hour, arr)
	f.Headers = forgedHeaders(arr-day, madeUpAuth)
	h.produce(m, f, h.tick(0, arr+1))
	h.caughtUp()
	secret := h.keys[0].Secret
	shown := []string{hex.EncodeToString(secret), base64.StdEncoding.EncodeToString(secret),
		base64.RawURLEncoding.EncodeToString(secret), string(secret), fmt.Sprint([]byte(secret))}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{"logs": logs.String(), "%v": fmt.Sprintf("%v", cfg), "%+v": fmt.Sprintf("%+v", cfg),
		"%#v": fmt.Sprintf("%#v", cfg), "%x": fmt.Sprintf("%x", cfg.Keys), "json": string(js)}
	if !strings.Contains(logs.String(), "not proven") {
		t.Fatal("no forged-header line in the logs: the test saw nothing")
	}
	for where, text := range texts {
		for _, s := range shown {
			if strings.Contains(text, s) {
				t.Errorf("the secret is in the %s", where)
			}
		}
	}
}

// TestOwnTicksForward: the ticks dedup appends verify when it reads them
// back, and forward the watermark.
func TestOwnTicksForward(t *testing.T) {
	h := newHarness(t, nil, 2)
	reg := prometheus.NewRegistry()
	cfg := h.config("a", vfs.NewMem())
	cfg.TickInterval = 100 * time.Millisecond
	cfg.Stream.Registerer = reg
	h.start(cfg)
	deadline := time.Now().Add(30 * time.Second)
	for {
		o := h.outputs()
		if len(watermarksOf(o, 0)) >= 4 && len(watermarksOf(o, 1)) >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("watermarks of partitions 0 and 1: %d and %d after 30s, want 4 each (2 ticks × 2 partitions)",
				len(watermarksOf(o, 0)), len(watermarksOf(o, 1)))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := metricSum(t, reg, "meterline_dedup_unauthenticated_ticks_total") + metricSum(t, reg, "meterline_dedup_forged_headers_total"); n != 0 {
		t.Errorf("%v of dedup's own ticks failed their check", n)
	}
}

// TestForgedHeadersKeepKeyChecks: dedup's headers that a producer made up
// never spare a record the key checks (docs/design.md, Event identity and
// keys): a record without a key, and one keyed by a naive join of its
// identity, on the partition their canonical key maps to, are re-routed
// like any misrouted record, and keep their broker timestamps as arrivals.
func TestForgedHeadersKeepKeyChecks(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h, reg := startWatched(t, brokers, 1)
		arr := t0 + 10*day
		noKey := h.event("acme", "api_calls", "k1", 1, arr-hour, arr)
		noKey.Key, noKey.Headers = nil, forgedHeaders(arr-30*day, madeUpAuth)
		joined := h.event("acme", "api_calls", "k2", 1, arr-hour, arr+100)
		joined.Key, joined.Headers = []byte("acme:api_calls:k2"), forgedHeaders(arr-30*day, "")
		h.produce(noKey, joined, h.tick(0, arr+1000))
		h.caughtUp()
		o := h.outputs()
		for id, want := range map[string]int64{"k1": arr, "k2": arr + 100} {
			if d := o.dedupedOf(id); len(d) != 1 || d[0].IngestTime != want {
				t.Errorf("%s: forwarded %+v, want once with ingest_time %d (its broker timestamp)", id, d, want)
			}
		}
		if got := metricSum(t, reg, "meterline_dedup_rerouted_total"); got != 2 {
			t.Errorf("meterline_dedup_rerouted_total = %v, want 2: forged headers skipped the key check", got)
		}
		if got := metricSum(t, reg, "meterline_dedup_forged_headers_total"); got != 2 {
			t.Errorf("meterline_dedup_forged_headers_total = %v, want 2", got)
		}
	})
}

// TestOtherKindWithOverflowingArrayCounts: a producer writes to
// usage.events a record of another kind whose array block counts overflow
// (an Aggregate whose group starts with a block of -2⁶³ items, then one of
// 5,000 empty properties). Dedup decodes any known kind to name it in its
// rejection; hamba/avro wrote the 5,000 items outside their slice, which
// corrupted the process and stopped it with a fatal runtime error (the
// whole test binary), on every restart. It is rejected as undecodable, and
// the next event is forwarded (docs/design.md, Bad input).
func TestOtherKindWithOverflowingArrayCounts(t *testing.T) {
	h := newHarness(t, nil, 1)
	st := h.start(h.configWith("a", prometheus.NewRegistry()))
	arr := t0 + 10*day
	v := []byte{0xC3, 0x01}
	v = binary.LittleEndian.AppendUint64(v, schemas.Fingerprint(schemas.KindAggregate))
	v = append(v, 2, 'c', 2, 'm')                 // customer_id, meter
	v = binary.AppendVarint(v, math.MinInt64)     // group: a block of -2⁶³ items,
	v = append(v, 0)                              // its byte size,
	v = binary.AppendVarint(v, 5000)              // then one of 5,000
	v = append(v, make([]byte, 2*5000)...)        // empty properties,
	v = append(v, 0, 2, 'S', 2, 2, 2, 2, 2, 2, 2) // the end, aggregation … updated_at
	v = append(v, 2, 2)
	r := rejectedBeforeEvent(t, h, st, &kgo.Record{Topic: h.names.EventsTopic(), Partition: 0, Key: []byte("k"), Value: v, Timestamp: time.UnixMilli(arr)})
	if r.Reason != schemas.ReasonUndecodable || !strings.Contains(r.Detail, "block count") {
		t.Errorf("rejected as %s (%s), want %s naming the block count", r.Reason, r.Detail, schemas.ReasonUndecodable)
	}
}
