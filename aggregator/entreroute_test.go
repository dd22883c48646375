package aggregator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsMisroutedReadAgainFromScratch: a customer's record
// produced to a wrong partition is re-produced to its canonical partition
// once by every aggregator that reads it from the start (a new consumer
// group, or state rebuilt from scratch), long after the first copy. Its
// copies carry the original's coordinates and broker time, and a copy
// whose original arrived before a record of its key already read on the
// canonical partition changes nothing: the customer's newer record
// (written on the canonical partition after the first copy) keeps
// deciding its events, for the aggregator that re-produced it again and
// for the first one, restarted on its state.
func TestEntitlementsMisroutedReadAgainFromScratch(t *testing.T) { testMisroutedReadAgain(t, nil) }

func TestRealEntitlementsMisroutedReadAgainFromScratch(t *testing.T) {
	testMisroutedReadAgain(t, testenv.RealKafka(t))
}

func testMisroutedReadAgain(t *testing.T, brokers []string) {
	const n = 2
	h := newEntHarness(t, brokers, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	wrong := (canon + 1) % n
	caps := func(limit int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Plan: fmt.Sprint("cap-", limit), Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "m1", Limit: limit, OnLimit: schemas.OnLimitReject}, {Meter: "m2", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	// acmeRecords returns the records of acme's key on the canonical
	// partition.
	acmeRecords := func() []*kgo.Record {
		var out []*kgo.Record
		for _, r := range testenv.ReadAll(t, h.brokers, h.names.EntitlementsTopic()) {
			if r.Partition == canon && string(r.Key) == string(key) {
				out = append(out, r)
			}
		}
		return out
	}
	awaitRecords := func(k int, what string) []*kgo.Record {
		deadline := time.Now().Add(30 * time.Second)
		for {
			if rs := acmeRecords(); len(rs) >= k {
				return rs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d records of acme on its canonical partition, want %d", what, len(acmeRecords()), k)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	events := func(meter string) {
		var recs []*kgo.Record
		for i := range 8 {
			at := time.Now().UnixMilli()
			recs = append(recs, h.dedupedEvent(canon, &schemas.DedupedEvent{EventID: fmt.Sprintf("%s-%d", meter, i), CustomerID: "acme",
				Meter: meter, Quantity: 1, EventTime: at, IngestTime: at}))
		}
		h.produce(recs...)
	}

	// A: the misrouted record (cap 5) is re-produced; then the customer's
	// record is written where it belongs (cap 100).
	fsA := vfs.NewMem()
	a := h.start(h.entConfig("a", fsA))
	old := &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: wrong, Key: key, Timestamp: time.Now(), Value: schemas.MustEncode(caps(5))}
	h.produce(old)
	awaitRecords(1, "the first aggregator")
	time.Sleep(5 * time.Millisecond)
	h.produce(h.entitlement(n, caps(100), time.Now().UnixMilli()))
	awaitRecords(2, "the newer record")
	time.Sleep(50 * time.Millisecond) // A reads it (its ticks go on)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}

	// B: a new consumer group with a changelog of its own reads
	// usage.entitlements from the start.
	adm := testenv.Admin(t, h.brokers)
	cfgB := h.entConfig("b", vfs.NewMem())
	cfgB.Topics.AggregateChangelog += "-b"
	cfgB.Stream.Group = h.group + "-b"
	createTopic(t, adm, n, map[string]*string{"cleanup.policy": ptr("compact")}, cfgB.Topics.AggregateChangelogTopic())
	b := h.start(cfgB)
	rs := awaitRecords(3, "the aggregator reading from scratch")
	first, again := rs[0], rs[2]
	if string(first.Value) != string(old.Value) || string(again.Value) != string(old.Value) {
		t.Fatalf("records of acme on its canonical partition: %d, the first and third are not the misrouted one", len(rs))
	}
	for _, c := range []*kgo.Record{first, again} {
		if got, want := headerOf(c, HeaderRerouted), fmt.Sprintf("%d/%d", old.Partition, old.Offset); got != want {
			t.Errorf("copy at offset %d: %s %q, want %q", c.Offset, HeaderRerouted, got, want)
		}
		if got, want := headerOf(c, HeaderArrival), fmt.Sprint(old.Timestamp.UnixMilli()); got != want {
			t.Errorf("copy at offset %d: %s %q, want %q", c.Offset, HeaderArrival, got, want)
		}
	}
	events("m1")
	awaitDecided(t, h, 8)
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}

	// A again, on its state: it reads the second copy, then the events of
	// both meters (m1's were B's group's only).
	a = h.start(h.entConfig("a", fsA))
	events("m2")
	awaitDecided(t, h, 16)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range readRejected(t, h) {
		t.Errorf("%s rejected %s: %s (the misrouted cap of 5 applied again)", r.EventID, r.Reason, r.Detail)
	}
	if got := openValues(t, h); got["acme/m1"] != 8 || got["acme/m2"] != 8 {
		t.Errorf("OPEN values %v, want 8 for m1 and m2", got)
	}

	// What compaction keeps of acme's key on its canonical partition, its
	// last record, is the newer record's value (restated), not the stale
	// copy's.
	newer := rs[1]
	last := acmeRecords()
	if l := last[len(last)-1]; string(l.Value) != string(newer.Value) {
		t.Errorf("the last of %d records of acme on its canonical partition is not the newer record's value", len(last))
	} else if o, copied := OriginOf(l); !copied || o.Arrival != newer.Timestamp.UnixMilli() || o.Partition != canon || o.Offset != newer.Offset {
		t.Errorf("the restated record's origin %+v (a copy: %v), want the newer record's", o, copied)
	}

	// C: a new group reads the topic as compaction leaves it, with a
	// changelog of its own: it decides every event, none over the stale
	// cap of 5.
	c, hc := h.startCompacted(adm, n, "c")
	events("m3")
	deadline := time.Now().Add(time.Minute)
	for {
		got := openValues(t, hc)
		if got["acme/m3"] == 8 || len(readRejected(t, hc)) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range readRejected(t, hc) {
		t.Errorf("after compaction: %s rejected %s: %s", r.EventID, r.Reason, r.Detail)
	}
}

// startCompacted copies usage.entitlements as compaction leaves it once
// delete.retention.ms has passed (the last record of each key on each
// partition, ticks and all, but no delete) to a topic of its own, and
// starts an aggregator with entitlements on it: a new group, instance
// and topics suffixed with suffix, and a changelog of its own. It returns
// the stage and a harness that reads its outputs.
func (h *aggHarness) startCompacted(adm *kadm.Client, n int32, suffix string) (*aggRunning, *aggHarness) {
	t := h.t
	compacted := map[string]*kgo.Record{}
	var order []string
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.EntitlementsTopic()) {
		k := fmt.Sprint(r.Partition, "/", string(r.Key))
		if _, ok := compacted[k]; !ok {
			order = append(order, k)
		}
		compacted[k] = r
	}
	cfg := h.entConfig(suffix, vfs.NewMem())
	cfg.Topics.AggregateChangelog += "-" + suffix
	cfg.Topics.Entitlements += "-compacted-" + suffix
	cfg.Topics.Rejected += "-" + suffix
	cfg.Topics.Aggregates += "-" + suffix
	cfg.Stream.Group = h.group + "-" + suffix
	for _, topic := range []string{cfg.Topics.EntitlementsTopic(), cfg.Topics.RejectedTopic(), cfg.Topics.AggregatesTopic()} {
		createTopic(t, adm, n, map[string]*string{"message.timestamp.type": ptr("CreateTime")}, topic)
	}
	createTopic(t, adm, n, map[string]*string{"cleanup.policy": ptr("compact")}, cfg.Topics.AggregateChangelogTopic())
	var kept []*kgo.Record
	for _, k := range order {
		if r := compacted[k]; r.Value != nil {
			kept = append(kept, &kgo.Record{Topic: cfg.Topics.EntitlementsTopic(), Partition: r.Partition, Key: r.Key, Value: r.Value,
				Headers: r.Headers, Timestamp: r.Timestamp})
		}
	}
	h.produce(kept...)
	hc := *h
	hc.names, hc.group = cfg.Topics, cfg.Stream.Group
	return h.start(cfg), &hc
}

// TestEntitlementsDeleteAfterMisroutedSurvivesCompaction: a customer's
// record produced to a wrong partition, then the customer deleted on its
// own partition. Once compaction has removed the delete (and the copy
// before it), a new group reading the topic from the start must not bring
// the misrouted record back: the aggregator deleted the original's key
// where it found it (HeaderMoved), so compaction removed the original
// too.
func TestEntitlementsDeleteAfterMisroutedSurvivesCompaction(t *testing.T) {
	testDeleteAfterMisrouted(t, nil)
}

func TestRealEntitlementsDeleteAfterMisroutedSurvivesCompaction(t *testing.T) {
	testDeleteAfterMisrouted(t, testenv.RealKafka(t))
}

func testDeleteAfterMisrouted(t *testing.T, brokers []string) {
	const n = 2
	h := newEntHarness(t, brokers, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	wrong := (canon + 1) % n
	// events writes 8 events of m1 (acme's capped meter) for acme,
	// arriving ahead (CreateTime) so that the aggregator has read its
	// entitlements up to then (the gate) before it decides them.
	events := func(prefix string, ahead time.Duration) {
		var recs []*kgo.Record
		for i := range 8 {
			at := time.Now().Add(ahead).UnixMilli()
			recs = append(recs, h.dedupedEvent(canon, &schemas.DedupedEvent{EventID: fmt.Sprint(prefix, i), CustomerID: "acme",
				Meter: "m1", Quantity: 1, EventTime: at, IngestTime: at}))
		}
		h.produce(recs...)
	}
	noneRejected := func(h *aggHarness, decided int) {
		t.Helper()
		awaitDecided(t, h, decided)
		for _, r := range readRejected(t, h) {
			t.Errorf("%s rejected %s: %s (the misrouted cap of 5 applied after the delete)", r.EventID, r.Reason, r.Detail)
		}
		if got := openValues(t, h); got["acme/m1"] != int64(decided) {
			t.Errorf("OPEN values %v, want %d for acme/m1", got, decided)
		}
	}

	a := h.start(h.entConfig("a", vfs.NewMem()))
	old := &kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: wrong, Key: key, Timestamp: time.Now(),
		Value: schemas.MustEncode(acmeCap(5))}
	h.produce(old)
	for deadline := time.Now().Add(30 * time.Second); len(h.canonRecords(n, "acme")) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the misrouted record was not re-produced to acme's partition")
		}
	}
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: canon, Key: key, Timestamp: time.Now()})
	events("a-", 0)
	noneRejected(h, 8)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	// The original's key is deleted where it was found, once, marked;
	// that delete is not moved in turn: the copies on acme's partition
	// are of the original only.
	var marks int
	recs := testenv.ReadAll(t, h.brokers, h.names.EntitlementsTopic())
	for _, r := range recs {
		if r.Partition == wrong && string(r.Key) == string(key) && r.Offset > old.Offset {
			if r.Value != nil || headerOf(r, HeaderMoved) != fmt.Sprint(old.Offset) {
				t.Errorf("record of acme at %d/%d after the misrouted one: value %d bytes, %s %q; want the delete marked moved from offset %d",
					r.Partition, r.Offset, len(r.Value), HeaderMoved, headerOf(r, HeaderMoved), old.Offset)
			}
			marks++
		}
	}
	if marks != 1 {
		t.Errorf("%d deletes of acme after the misrouted record on partition %d, want 1", marks, wrong)
	}
	for _, r := range recs {
		if o := headerOf(r, HeaderRerouted); o != "" && o != fmt.Sprintf("%d/%d", wrong, old.Offset) {
			t.Errorf("a copy at %d/%d of %s: only the misrouted record is moved", r.Partition, r.Offset, o)
		}
	}

	// Compaction has removed acme's delete and everything before it on
	// its partition, and the misrouted original with the delete after it
	// on the wrong one: a new group finds no entitlements of acme and
	// decides the 8 events above and 8 more alike, none over a cap.
	c, hc := h.startCompacted(testenv.Admin(t, h.brokers), n, "c")
	events("c-", 2*time.Second)
	noneRejected(hc, 16)
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestEntitlementsCopyNeverReroutedTwice: a record marked as re-produced
// found on another partition than its customer's is rejected (invalid),
// not re-produced again (docs/entitlements.md, The aggregator, 1).
func TestEntitlementsCopyNeverReroutedTwice(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: (canon + 1) % n, Key: key, Timestamp: time.Now(),
		Headers: []kgo.RecordHeader{{Key: HeaderRerouted, Value: []byte("0/0")}, {Key: HeaderArrival, Value: []byte("1")}},
		Value:   schemas.MustEncode(&schemas.Entitlements{CustomerID: "acme", Plan: "p", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}})})
	run := h.start(h.entConfig("a", vfs.NewMem()))
	deadline := time.Now().Add(30 * time.Second)
	for len(readRejected(t, h)) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rej := readRejected(t, h)
	if len(rej) != 1 || rej[0].Reason != schemas.ReasonInvalid || !strings.Contains(rej[0].Detail, "never re-routed twice") {
		t.Fatalf("rejected %+v, want the marked record, invalid", rej)
	}
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.EntitlementsTopic()) {
		if r.Partition == canon && string(r.Key) == string(key) {
			t.Errorf("the marked record was re-produced to partition %d", canon)
		}
	}
}

func headerOf(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// TestEntitlementsStaleCopy: which records of a customer's key on its
// canonical partition apply, in the orders compaction and re-reads can
// leave them: a copy applies unless its original reached the topic no
// later than the last record of the key applied; a record written on the
// canonical partition always applies; a copy's claimed arrival stands,
// even after its own broker time (every copy of an original orders
// alike: OriginOf); malformed headers make an ordinary record.
// A copy older than the last record applied restates that record (its
// value, marked with its origin); that restated record, read back, is
// skipped and restates nothing.
func TestEntitlementsStaleCopy(t *testing.T) {
	rec := func(p int32, off, ts int64, hdr ...string) *kgo.Record {
		r := &kgo.Record{Partition: p, Offset: off, Timestamp: time.UnixMilli(ts), Value: []byte(fmt.Sprint("v", off))}
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: hdr[i], Value: []byte(hdr[i+1])})
		}
		return r
	}
	copyOf := func(off, ts int64, from string, arrival int64) *kgo.Record {
		return rec(1, off, ts, HeaderRerouted, from, HeaderArrival, fmt.Sprint(arrival))
	}
	// valued gives r the value of the record it copies (a copy of a
	// record carries its value).
	valued := func(r *kgo.Record, v string) *kgo.Record { r.Value = []byte(v); return r }
	// want per record: "applied", "skipped", or "restates <value>".
	for _, tc := range []struct {
		name string
		recs []*kgo.Record
		want []string
	}{
		{"copy, newer record, copy again", []*kgo.Record{copyOf(0, 2000, "0/7", 1000), rec(1, 1, 3000), copyOf(2, 9000, "0/7", 1000)},
			[]string{"applied", "applied", "restates v1"}},
		{"first copy compacted away", []*kgo.Record{rec(1, 1, 3000), copyOf(2, 9000, "0/7", 1000)}, []string{"applied", "restates v1"}},
		{"restated record read back", []*kgo.Record{rec(1, 1, 3000), copyOf(2, 9000, "0/7", 1000), valued(copyOf(3, 9001, "1/1", 3000), "v1")},
			[]string{"applied", "restates v1", "skipped"}},
		{"two aggregators' copies", []*kgo.Record{copyOf(0, 2000, "0/7", 1000), valued(copyOf(1, 2001, "0/7", 1000), "v0")}, []string{"applied", "skipped"}},
		{"a newer misrouted record", []*kgo.Record{copyOf(0, 2000, "0/7", 1000), rec(1, 1, 3000), copyOf(2, 5000, "0/9", 4000)},
			[]string{"applied", "applied", "applied"}},
		{"same millisecond, later offset", []*kgo.Record{copyOf(0, 2000, "0/7", 1000), copyOf(1, 2000, "0/8", 1000)}, []string{"applied", "applied"}},
		{"older copies in reverse", []*kgo.Record{copyOf(0, 5000, "0/9", 4000), copyOf(1, 5001, "0/7", 1000)}, []string{"applied", "restates v0"}},
		{"claimed arrival after its broker time", []*kgo.Record{copyOf(0, 2000, "0/7", 1<<40), copyOf(1, 9000, "0/8", 5000)},
			[]string{"applied", "restates v0"}},
		{"malformed headers", []*kgo.Record{rec(1, 1, 3000), rec(1, 2, 9000, HeaderRerouted, "0-7", HeaderArrival, "1000"),
			rec(1, 3, 9001, HeaderRerouted, "0/7", HeaderArrival, "1000", HeaderArrival, "1000")}, []string{"applied", "applied", "applied"}},
		{"clock stepped back", []*kgo.Record{rec(1, 1, 3000), rec(1, 2, 2500), copyOf(3, 9000, "0/7", 2800)}, []string{"applied", "applied", "restates v2"}},
	} {
		t.Run(tc.name, func(t *testing.T) { checkStaleCopies(t, tc.recs, tc.want) })
	}
}

// createTopic creates a topic of n partitions and waits until the
// brokers' metadata shows it: a stage started before then (on the real
// broker) stops on a topic it is told is missing.
func createTopic(t testing.TB, adm *kadm.Client, n int32, configs map[string]*string, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, n, 1, configs, name); err != nil {
		t.Fatal(err)
	}
	if err := topics.WaitVisible(ctx, adm, name); err != nil {
		t.Fatal(err)
	}
}
