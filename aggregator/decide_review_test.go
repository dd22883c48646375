package aggregator

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// A model of one customer's key on usage.entitlements: its canonical
// partition (0) and a partition a client with another partitioner writes
// it to (1). Records get the broker time of their partition's leader
// (LogAppendTime), which the scripts step back and skew.
type modelTopic struct {
	logs [2][]*kgo.Record
	next [2]int64 // the next offset of each partition
}

func (m *modelTopic) append(p int32, ts int64, value []byte, hdr ...kgo.RecordHeader) {
	m.logs[p] = append(m.logs[p], &kgo.Record{Topic: "usage.entitlements", Partition: p, Offset: m.next[p],
		Key: []byte("acme"), Value: value, Timestamp: time.UnixMilli(ts), Headers: hdr})
	m.next[p]++
}

// compacted is the topic once compaction kept the last record of the key
// per partition (a tombstone included), offsets unchanged.
func (m *modelTopic) compacted() *modelTopic {
	c := &modelTopic{next: m.next}
	for p, l := range m.logs {
		if len(l) > 0 {
			c.logs[p] = []*kgo.Record{l[len(l)-1]}
		}
	}
	return c
}

// modelReader is an aggregator (its own group and state) reading the
// model topic: partition 1's records are re-produced to partition 0 as
// entRecords does, partition 0's decided by staleCopy, a restated record
// appended to partition 0. It reads a log by position, so a compacted
// topic (offsets kept) reads as a list.
type modelReader struct {
	st    mapState
	pos   [2]int
	value []byte // the value in effect; nil: none or deleted
	skipQ bool   // partition 1 is not read for now
}

func newModelReader() *modelReader { return &modelReader{st: mapState{}} }

// read reads everything not read yet (what it appends included), the
// leader of partition 0 at broker time clock; it reports false when it
// does not stop (more than limit records appended).
func (r *modelReader) read(t *testing.T, m *modelTopic, clock int64, limit int) bool {
	pt := &partition{p: 0, pr: &processor{now: func() time.Time { return time.UnixMilli(clock) }}}
	n := 0
	for r.pos[0] < len(m.logs[0]) || !r.skipQ && r.pos[1] < len(m.logs[1]) {
		if n > limit {
			return false
		}
		if !r.skipQ && r.pos[1] < len(m.logs[1]) {
			q := m.logs[1][r.pos[1]]
			r.pos[1]++
			m.append(0, clock, q.Value,
				kgo.RecordHeader{Key: HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", q.Partition, q.Offset)},
				kgo.RecordHeader{Key: HeaderArrival, Value: strconv.AppendInt(nil, q.Timestamp.UnixMilli(), 10)})
			n++
			continue
		}
		rec := m.logs[0][r.pos[0]]
		r.pos[0]++
		o, stale, restate, err := pt.staleCopy(r.st, rec, originKey("acme"))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !stale:
			r.st[string(originKey("acme"))] = o.encodeWith(rec.Value)
			r.value = rec.Value
		case restate != nil:
			m.append(0, clock, restate.Value, restate.Headers...)
			n++
			if modelClockMoves {
				clock++ // each round trip takes a millisecond
			}
		}
	}
	return true
}

// modelClockMoves: partition 0's clock moves a millisecond per restated
// record (a loop then ends once the clock catches up).
var modelClockMoves = true

// getValue is what `meterline entitlements get` decides of partition 0
// (internal/cli readEntitlements: DecideRecord, nothing re-produced).
func getValue(m *modelTopic) []byte {
	var last RecordOrigin
	var value []byte
	have := false
	for _, r := range m.logs[0] {
		o, apply, _ := DecideRecord(r, last, value, have)
		if apply {
			last, value, have = o, r.Value, true
		}
	}
	return value
}

// modelStep is one write of the billing system: to partition p (1: a
// misrouted record) at broker time ts, and the broker time of partition
// 0's leader while the aggregator handles it.
type modelStep struct {
	p        int32
	value    []byte
	ts, now0 int64
}

func (s modelStep) String() string {
	v := "del"
	if s.value != nil {
		v = string(s.value)
	}
	if s.p == 1 {
		return fmt.Sprintf("misrouted %s@%d (partition 0 at %d)", v, s.ts, s.now0)
	}
	return fmt.Sprintf("%s@%d", v, s.ts)
}

func describeLog(m *modelTopic) string {
	var b strings.Builder
	for p, l := range m.logs {
		fmt.Fprintf(&b, "\n  partition %d:", p)
		for _, r := range l {
			v := "del"
			if r.Value != nil {
				v = string(r.Value)
			}
			fmt.Fprintf(&b, " [%d %s@%d", r.Offset, v, r.Timestamp.UnixMilli())
			for _, h := range r.Headers {
				fmt.Fprintf(&b, " %s=%s", strings.TrimPrefix(h.Key, "meterline-"), h.Value)
			}
			b.WriteString("]")
		}
	}
	return b.String()
}

// modelRun plays steps with a first aggregator A that reads each write as
// it lands (laggingQ: its reader of partition 1 re-produces only after
// the last step), then a second group B from the start of the topic
// while A still runs, then, the topic compacted, a third C from its start
// while both run, and `entitlements get` on the topic and on it
// compacted. Every reader must end with the same value, and restating
// must stop. It returns what went wrong, "" if nothing.
func modelRun(t *testing.T, steps []modelStep, laggingQ bool) string {
	const limit, later = 40, 1000
	m := &modelTopic{}
	a := newModelReader()
	a.skipQ = laggingQ
	for _, s := range steps {
		m.append(s.p, s.ts, s.value)
		if !a.read(t, m, s.now0, limit) {
			return "A restates for ever" + describeLog(m)
		}
	}
	a.skipQ = false
	settle := func(rs ...*modelReader) bool {
		for range limit {
			before := len(m.logs[0])
			for _, r := range rs {
				if !r.read(t, m, later, limit) {
					return false
				}
			}
			if len(m.logs[0]) == before {
				return true
			}
		}
		return false
	}
	if !settle(a) {
		return "A restates for ever" + describeLog(m)
	}
	aAlone := a.value
	b := newModelReader()
	if !settle(b, a) {
		return "A and B restate for ever" + describeLog(m)
	}
	getFull := getValue(m)
	full := describeLog(m)
	// Compaction: A and B have read everything; the log keeps the last
	// record per partition.
	m = m.compacted()
	a.pos, b.pos = [2]int{len(m.logs[0]), len(m.logs[1])}, [2]int{len(m.logs[0]), len(m.logs[1])}
	c := newModelReader()
	if !settle(c, a, b) {
		return "A, B and C restate for ever" + full + "\n compacted:" + describeLog(m)
	}
	names := []string{"A (caught up, before B)", "A (caught up)", "B (new group from the start)", "C (compacted topic from the start)", "get", "get (compacted)"}
	vals := [][]byte{aAlone, a.value, b.value, c.value, getFull, getValue(m)}
	same := true
	for _, v := range vals[1:] {
		same = same && bytes.Equal(v, vals[0])
	}
	if same {
		return ""
	}
	var out strings.Builder
	for i, k := range names {
		fmt.Fprintf(&out, "%s=%q ", k, vals[i])
	}
	return out.String() + full + "\n compacted (then C):" + describeLog(m)
}

// TestDecideRecordModel enumerates short histories of one customer's key
// (writes to its partition and misrouted ones, deletes, broker clocks
// that step back or lag between leaders) and checks that every reader
// decides alike and that restating stops (modelRun): histories of up to
// 3 writes of 3 values at 3 broker times (-short), and of 4 writes at 2.
func TestDecideRecordModel(t *testing.T) {
	walkModel(t, 3, []int64{10, 20, 30})
	if !testing.Short() {
		walkModel(t, 4, []int64{10, 20})
	}
}

func walkModel(t *testing.T, maxLen int, times []int64) {
	var opts []modelStep
	for _, v := range [][]byte{[]byte("a"), []byte("b"), nil} {
		for _, ts := range times {
			opts = append(opts, modelStep{p: 0, value: v, ts: ts, now0: ts})
			for _, now0 := range times {
				opts = append(opts, modelStep{p: 1, value: v, ts: ts, now0: now0})
			}
		}
	}
	found := map[string]bool{}
	var walk func(steps []modelStep)
	walk = func(steps []modelStep) {
		if len(steps) > 0 {
			for _, lag := range []bool{false, true} {
				if d := modelRun(t, steps, lag); d != "" {
					kind := strings.SplitN(d, "=", 2)[0]
					if strings.Contains(d, "for ever") {
						kind = strings.SplitN(d, "\n", 2)[0]
					}
					if !found[kind] {
						found[kind] = true
						t.Errorf("%v (A lagging on partition 1: %v): %s", steps, lag, d)
					}
				}
			}
		}
		if len(steps) == maxLen {
			return
		}
		for _, o := range opts {
			walk(append(steps[:len(steps):len(steps)], o))
		}
	}
	walk(nil)
}

// TestDecideRecordCopyMadeBehind: the two histories the model found with a
// copy's arrival capped at its own broker time, each a misrouted record
// re-produced while the leader of the canonical partition has a clock
// behind the original's (another broker, or a clock stepped back).
//
//   - b misrouted at 20, re-produced at 10 after a@20 on the canonical
//     partition: the caught-up aggregator skipped the copy (origin 10)
//     and kept a, until a new group re-produced it at 1000 (origin 20,
//     after a's): both then applied b.
//   - the restated record of a@20, written at 10, read back as older
//     than a's origin, and restated again, a record per round trip until
//     the clock caught up (and as many again per group that read them);
//     DecideRecord now also takes a copy of last's coordinates as a copy
//     of last, whatever its arrival.
//
// And a copy cannot claim an arrival so late that the millisecond after
// it overflows.
func TestDecideRecordCopyMadeBehind(t *testing.T) {
	for _, steps := range [][]modelStep{
		{{p: 0, value: []byte("a"), ts: 20, now0: 20}, {p: 1, value: []byte("b"), ts: 20, now0: 10}},
	} {
		for _, lag := range []bool{false, true} {
			if d := modelRun(t, steps, lag); d != "" {
				t.Errorf("%v (A lagging on partition 1: %v): %s", steps, lag, d)
			}
		}
	}
	// The restated record of a@20 (partition 1, offset 0), written at 10.
	restated := &kgo.Record{Partition: 1, Offset: 5, Timestamp: time.UnixMilli(10), Value: []byte("a"), Headers: []kgo.RecordHeader{
		{Key: HeaderRerouted, Value: []byte("1/0")}, {Key: HeaderArrival, Value: []byte("20")}}}
	if _, apply, restate := DecideRecord(restated, RecordOrigin{Arrival: 20, Partition: 1}, []byte("a"), true); apply || restate {
		t.Errorf("the restated record of the origin in effect: apply %v, restate %v; want it skipped, nothing restated", apply, restate)
	}
	for _, a := range []string{"9223372036854775807", fmt.Sprint(maxArrival + 1)} {
		r := &kgo.Record{Partition: 1, Offset: 5, Timestamp: time.UnixMilli(10), Value: []byte("x"), Headers: []kgo.RecordHeader{
			{Key: HeaderRerouted, Value: []byte("0/3")}, {Key: HeaderArrival, Value: []byte(a)}}}
		if o, copied := OriginOf(r); copied {
			t.Errorf("arrival %s: a copy of origin %+v; want an ordinary record", a, o)
		}
	}
	last := RecordOrigin{Arrival: maxArrival, Partition: 0, Offset: 3}
	o, apply, _ := DecideRecord(&kgo.Record{Partition: 1, Offset: 6, Timestamp: time.UnixMilli(11)}, last, []byte("x"), true)
	if !apply || !o.After(last) {
		t.Errorf("an ordinary record after a copy claiming %d: origin %+v, applied %v; want applied after it", maxArrival, o, apply)
	}
}

// TestEntitlementsRejectedRecordNotKeptByCompaction: a customer's record on
// its canonical partition that the aggregator rejects (undecodable: a
// billing system's own writer) leaves the record before it in effect
// (docs/entitlements.md); it must not stay the last record of the key,
// which is what compaction keeps and a stage reading the compacted topic
// from the start applies (it would reject it and apply the default plan):
// the value in effect is restated after it.
func TestEntitlementsRejectedRecordNotKeptByCompaction(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, n)
	decided := 0
	events := func() {
		h.produce(h.acmeEvents(canon, "m1", decided, 1)...)
		decided++
		awaitDecided(t, h, decided)
	}
	run := h.start(h.entConfig("a", vfs.NewMem()))
	h.produce(h.entitlement(n, acmeCap(100), time.Now().UnixMilli()))
	events()
	inEffect := h.canonRecords(n, "acme")[0]
	h.produce(&kgo.Record{Topic: h.names.EntitlementsTopic(), Partition: canon, Key: key, Timestamp: time.Now(), Value: []byte("not an entitlements record")})
	events()
	time.Sleep(100 * time.Millisecond) // a restated record, if any, is committed with the event's transaction
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rs := h.canonRecords(n, "acme")
	if l := rs[len(rs)-1]; string(l.Value) != string(inEffect.Value) {
		t.Errorf("the last of %d records of acme on its canonical partition (what compaction keeps) is %q, not the one in effect", len(rs), l.Value)
	} else if o, copied := OriginOf(l); !copied || o.Arrival != inEffect.Timestamp.UnixMilli() || o.Offset != inEffect.Offset {
		t.Errorf("the restated record's origin %+v (a copy: %v), want the record in effect's", o, copied)
	}
}
