package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestStaleCopyRestatesTheValueInEffect: the last record of a customer's
// key on its canonical partition (what compaction keeps, and all that an
// aggregator reading the compacted topic from the start applies) must carry
// the value in effect. A copy that claims the origin of the last record
// applied but carries another value is skipped; it must then restate the
// value in effect, or it would be what compaction keeps. It happens without
// any forged header (a restated record read back after a record written on
// the canonical partition with a broker time that stepped back: the origin
// stays, the value changed), and with one (a client copying the headers of
// the last record onto another value: producers set headers too,
// docs/entitlements.md, The aggregator, 1). At the same origin the greater
// value wins (a tombstone least), so that stages that disagree converge; a
// copy carrying the value in effect at the same origin is skipped and
// restates nothing. A record written on the canonical partition whose
// broker time stepped back orders a millisecond after the last origin.
func TestStaleCopyRestatesTheValueInEffect(t *testing.T) {
	rec := func(off, ts int64, value string, hdr ...string) *kgo.Record {
		r := &kgo.Record{Partition: 1, Offset: off, Timestamp: time.UnixMilli(ts)}
		if value != "" {
			r.Value = []byte(value)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: hdr[i], Value: []byte(hdr[i+1])})
		}
		return r
	}
	copyOf := func(off, ts int64, value, from string, arrival int64) *kgo.Record {
		return rec(off, ts, value, HeaderRerouted, from, HeaderArrival, fmt.Sprint(arrival))
	}
	// want per record: "applied", "skipped", or "restates <value>"
	// ("restates <nil>": a tombstone).
	for _, tc := range []struct {
		name string
		recs []*kgo.Record
		want []string
	}{
		{"restated record read back after a clock stepped back", []*kgo.Record{
			rec(1, 3000, "v1"),
			copyOf(2, 9000, "old", "0/7", 1000), // a stale copy: restates v1, origin 1/1@3000
			rec(3, 2500, "v3"),                  // broker time behind: applied, origin stays 1/1@3000
			copyOf(4, 9001, "v1", "1/1", 3000),  // the restated record: same origin, not the value in effect
		}, []string{"applied", "restates v1", "applied", "restates v3"}},
		{"the value in effect restated again is skipped", []*kgo.Record{
			rec(1, 3000, "v1"), rec(3, 2500, "v3"), copyOf(4, 9001, "v3", "1/3", 3001),
		}, []string{"applied", "applied", "skipped"}},
		{"headers of the last record copied onto another value", []*kgo.Record{
			rec(1, 3000, "v1"), copyOf(2, 9000, "forged", "1/1", 3000),
		}, []string{"applied", "restates v1"}},
		{"a tombstone at the origin of a value", []*kgo.Record{
			rec(1, 3000, "v1"), copyOf(2, 9000, "", "1/1", 3000),
		}, []string{"applied", "restates v1"}},
		{"a value at the origin of a tombstone", []*kgo.Record{
			rec(1, 3000, ""), copyOf(2, 9000, "v2", "1/1", 3000),
		}, []string{"applied", "applied"}},
		{"headers of the last record copied onto a greater value", []*kgo.Record{
			rec(1, 3000, "v1"), copyOf(2, 9000, "x-forged", "1/1", 3000), copyOf(3, 9001, "v1", "1/1", 3000),
		}, []string{"applied", "applied", "restates x-forged"}},
		{"a misrouted record read again after its customer was deleted", []*kgo.Record{
			rec(1, 1000, "v1"), rec(2, 2000, ""), copyOf(3, 9000, "m", "0/7", 1500),
		}, []string{"applied", "applied", "restates <nil>"}},
		{"deleted, created again, then a misrouted record read again", []*kgo.Record{
			copyOf(0, 1200, "m", "0/7", 1000), rec(1, 2000, ""), rec(2, 3000, "v2"), copyOf(3, 9000, "m", "0/7", 1000),
		}, []string{"applied", "applied", "applied", "restates v2"}},
		{"a misrouted tombstone", []*kgo.Record{
			rec(1, 1000, "v1"), copyOf(2, 2500, "", "0/7", 2000), copyOf(3, 9000, "", "0/7", 2000),
		}, []string{"applied", "applied", "skipped"}},
		{"two aggregators' copies of one original", []*kgo.Record{
			copyOf(0, 2000, "m", "0/7", 1000), copyOf(1, 2001, "m", "0/7", 1000),
		}, []string{"applied", "skipped"}},
	} {
		t.Run(tc.name, func(t *testing.T) { checkStaleCopies(t, tc.recs, tc.want) })
	}
}

// checkStaleCopies reads recs, records of acme's key on partition 1, in
// order, and checks what staleCopy decides of each: "applied", "skipped",
// or "restates <value>" ("<nil>": a delete).
func checkStaleCopies(t *testing.T, recs []*kgo.Record, want []string) {
	t.Helper()
	pt := &partition{p: 1, pr: &processor{now: time.Now}}
	st := mapState{}
	for i, r := range recs {
		o, stale, restate, err := pt.staleCopy(st, r, originKey("acme"))
		if err != nil {
			t.Fatal(err)
		}
		got := "applied"
		switch {
		case !stale:
			st[string(originKey("acme"))] = o.encodeWith(r.Value)
		case restate != nil:
			v := string(restate.Value)
			if restate.Value == nil {
				v = "<nil>"
			}
			got = "restates " + v
			if ro, copied := OriginOf(restate); !copied || ro != o || restate.Partition != pt.p {
				t.Errorf("record %d: restated to partition %d with origin %+v (a copy: %v), want partition %d, origin %+v",
					i, restate.Partition, ro, copied, pt.p, o)
			}
		default:
			got = "skipped"
		}
		if got != want[i] {
			t.Errorf("record %d (offset %d): %s, want %s", i, r.Offset, got, want[i])
		}
	}
}

// TestEntitlementsForgedCopyNotKeptByCompaction: a client writes, on a
// customer's canonical partition, a record carrying the re-route headers
// of the record in effect (its partition, offset and broker time: anyone
// who reads the topic knows them) with another value, a cap of 5 instead
// of 100 (its encoding sorts before the one in effect's). Every
// aggregator reading the topic skips it (the same origin as the record
// applied, a lesser value); but it must not stay the last record of the
// key, which is what compaction keeps and a stage reading the compacted
// topic from the start applies: the value in effect is restated after it.
func TestEntitlementsForgedCopyNotKeptByCompaction(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	decided := 0
	events := func(k int) {
		h.produce(h.acmeEvents(canon, "m1", decided, k)...)
		decided += k
		awaitDecided(t, h, decided)
	}
	run := h.start(h.entConfig("a", vfs.NewMem()))
	h.produce(h.entitlement(n, acmeCap(100), time.Now().UnixMilli()))
	events(1)
	rs := h.canonRecords(n, "acme")
	if len(rs) != 1 {
		t.Fatalf("%d records of acme, want 1", len(rs))
	}
	inEffect := rs[0]
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: canon, Key: key, Timestamp: time.Now(),
		Value: schemas.MustEncode(acmeCap(5)), Headers: []kgo.RecordHeader{
			{Key: HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", inEffect.Partition, inEffect.Offset)},
			{Key: HeaderArrival, Value: fmt.Append(nil, inEffect.Timestamp.UnixMilli())}}})
	events(8)
	time.Sleep(100 * time.Millisecond) // a restated record, if any, is committed with the events' transaction
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range readRejected(t, h) {
		t.Errorf("%s rejected %s: %s (the forged cap of 5 applied)", r.EventID, r.Reason, r.Detail)
	}
	rs = h.canonRecords(n, "acme")
	if l := rs[len(rs)-1]; string(l.Value) != string(inEffect.Value) {
		t.Errorf("the last of %d records of acme on its canonical partition (what compaction keeps) has the forged value, not the one in effect", len(rs))
	}
}

// TestRestatesConverge: two stages that hold different values at the same
// origin of a customer (one applied a client's record with the headers of
// the record in effect; one read the compacted topic from the start
// while the stale copy was the key's last record), or different origins,
// restate each other's records at most a few times before they agree:
// no storm of restated records.
func TestRestatesConverge(t *testing.T) {
	type stage struct {
		pt *partition
		st mapState
	}
	newStage := func(origin RecordOrigin, value []byte) *stage {
		s := &stage{pt: &partition{p: 1, pr: &processor{now: time.Now}}, st: mapState{}}
		s.st[string(originKey("acme"))] = origin.encodeWith(value)
		return s
	}
	o := RecordOrigin{Arrival: 3000, Partition: 1, Offset: 1}
	for _, tc := range []struct {
		name string
		a, b *stage
	}{
		{"same origin, values", newStage(o, []byte("v1")), newStage(o, []byte("v2"))},
		{"same origin, a value and a tombstone", newStage(o, []byte("v1")), newStage(o, nil)},
		{"origins", newStage(o, []byte("v1")), newStage(RecordOrigin{Arrival: 2999, Partition: 0, Offset: 9}, []byte("v0"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The restated record of a, read by b, and so on: each
			// restated record read by both (the topic is shared).
			v, _, _ := tc.a.st.Get(originKey("acme"))
			r := &kgo.Record{Partition: 1, Offset: 100, Timestamp: time.UnixMilli(9000), Headers: []kgo.RecordHeader{
				{Key: HeaderRerouted, Value: fmt.Appendf(nil, "1/%d", o.Offset)}, {Key: HeaderArrival, Value: fmt.Append(nil, o.Arrival)}}}
			if v[20] == 1 {
				r.Value = v[21:]
			}
			queue := []*kgo.Record{r}
			rounds := 0
			for len(queue) > 0 {
				if rounds++; rounds > 6 {
					t.Fatalf("still restating after %d records", rounds)
				}
				r := queue[0]
				queue = queue[1:]
				for _, s := range []*stage{tc.a, tc.b} {
					o, stale, restate, err := s.pt.staleCopy(s.st, r, originKey("acme"))
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case !stale:
						s.st[string(originKey("acme"))] = o.encodeWith(r.Value)
					case restate != nil:
						restate.Offset = r.Offset + int64(len(queue)) + 1
						queue = append(queue, restate)
					}
				}
			}
			va, _, _ := tc.a.st.Get(originKey("acme"))
			vb, _, _ := tc.b.st.Get(originKey("acme"))
			if string(va) != string(vb) {
				t.Errorf("after %d records the stages hold %q and %q", rounds, va, vb)
			}
			t.Logf("%d records", rounds)
		})
	}
}

// TestEntitlementsTwoGroupsRestateBounded: two aggregators (two consumer
// groups, each with a changelog of its own) start at once on a topic
// where a customer's misrouted record is older than its record on the
// canonical partition. Each re-produces the misrouted one, each finds
// both copies stale and restates the record in effect after each (once
// after both when it reads them in one fetch): 2 copies and 2 to 4
// restated records, then nothing more (no storm), the last
// record of the key the one in effect, and neither applies the old cap.
func TestEntitlementsTwoGroupsRestateBounded(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: (canon + 1) % n, Key: key, Timestamp: time.Now(),
		Value: schemas.MustEncode(acmeCap(5))})
	time.Sleep(5 * time.Millisecond)
	h.produce(h.entitlement(n, acmeCap(100), time.Now().UnixMilli()))
	inEffect := h.canonRecords(n, "acme")[0]

	adm := testenv.Admin(t, h.brokers)
	cfgB := h.entConfig("b", vfs.NewMem())
	cfgB.Topics.AggregateChangelog += "-b"
	cfgB.Topics.Aggregates += "-b"
	cfgB.Topics.Rejected += "-b"
	cfgB.Topics.Balances += "-b"
	cfgB.Stream.Group = h.group + "-b"
	for _, topic := range []string{cfgB.Topics.AggregateChangelogTopic(), cfgB.Topics.AggregatesTopic(), cfgB.Topics.RejectedTopic(),
		cfgB.Topics.BalancesTopic()} {
		cfg := map[string]*string{}
		if topic == cfgB.Topics.AggregateChangelogTopic() || topic == cfgB.Topics.BalancesTopic() {
			cfg["cleanup.policy"] = ptr("compact")
		}
		createTopic(t, adm, n, cfg, topic)
	}
	a := h.start(h.entConfig("a", vfs.NewMem()))
	b := h.start(cfgB)
	h.produce(h.acmeEvents(canon, "m1", 0, 8)...)
	awaitDecided(t, h, 8)
	hb := *h
	hb.names, hb.group = cfgB.Topics, cfgB.Stream.Group
	awaitDecided(t, &hb, 8)
	time.Sleep(time.Second) // restated records, if they went on, would pile up meanwhile
	rs := h.canonRecords(n, "acme")
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if len(rs) < 5 || len(rs) > 7 {
		t.Errorf("%d records of acme on its canonical partition, want 5 to 7 (the record, 2 copies, 2 to 4 restated)", len(rs))
	}
	if l := rs[len(rs)-1]; string(l.Value) != string(inEffect.Value) {
		t.Errorf("the last record of acme is not the one in effect")
	}
	for _, hh := range []*aggHarness{h, &hb} {
		for _, r := range readRejected(t, hh) {
			t.Errorf("%s: %s rejected %s: %s (the misrouted cap of 5 applied)", hh.group, r.EventID, r.Reason, r.Detail)
		}
	}
}
