package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// FuzzDedupRecord drives dedup's per-record path (Process, on the real
// processor) with a program of raw usage.events records, whatever a
// producer can write: key, value, headers, partition and broker
// timestamp, with commits, aborted transactions processed again, and
// restores of a partition's state from its changelog between them. Each
// events partition runs on a stream.Local (an in-memory store and
// transaction); records dedup re-routes are delivered to their partition
// as the broker would. After each transaction it checks that (docs/design.md,
// Bad input; docs/testing.md, Fuzzing):
//
//   - Process returns no error and nothing panics;
//   - every input record is accounted for exactly once, by one
//     usage.deduped event, usage.duplicates copy, usage.rejected record or
//     re-route that names its partition and offset, and only a tick by
//     none;
//   - a rejection carries a reason code dedup raises, the record's
//     coordinates and timestamp, and the lengths, prefixes and SHA-256 of
//     its raw key and value;
//   - every output decodes with the project's decoders, is keyed and placed
//     as the topics table says (docs/design.md, Topics), and fits
//     MaxRecordBytes;
//   - a re-routed record, delivered, is never re-routed again;
//   - the records of an aborted transaction, processed again, give the
//     outputs they gave before, watermarks aside;
//   - a partition restored from its changelog gives the outputs it gives
//     without the restore, watermarks aside;
//   - no identity reaches usage.deduped twice, across aborts and
//     restores, unless a conflicting copy arrives W or more after the
//     first or is read once the first one's key may have expired
//     (docs/design.md, Known limits);
//   - the counters of accepted, duplicate, rejected and re-routed records
//     equal the committed outputs.
func FuzzDedupRecord(f *testing.F) {
	for _, p := range fuzzRecordSeeds(f) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		h := newRecordHarness(t)
		defer h.close()
		h.run(prog)
		if !h.restored {
			return
		}
		// The same program without the restores: a partition restored
		// from its changelog decides as the one that kept its store.
		kept := newRecordHarness(t)
		defer kept.close()
		kept.noRestore = true
		kept.run(prog)
		for p := range h.outputs {
			a, b := h.outputs[p], kept.outputs[p]
			if len(a) != len(b) {
				t.Fatalf("partition %d: %d outputs with restores, %d without", p, len(a), len(b))
			}
			for i := range a {
				if !sameRecord(a[i], b[i]) {
					t.Fatalf("partition %d: output %d is %s/%d key %q with restores, %s/%d key %q without",
						p, i, a[i].Topic, a[i].Partition, a[i].Key, b[i].Topic, b[i].Partition, b[i].Key)
				}
			}
		}
	})
}

// sameRecord reports whether two output records are the same.
func sameRecord(x, y *kgo.Record) bool {
	return x.Topic == y.Topic && x.Partition == y.Partition && bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value) &&
		fmt.Sprint(x.Headers) == fmt.Sprint(y.Headers)
}

// The harness's configuration: a short window and bucket, so that a
// program's clock steps reach expiry.
const (
	frEvents   = 3
	frDeduped  = 2
	frWindow   = 48 * time.Hour
	frSkew     = time.Hour
	frBucket   = time.Hour
	frStart    = int64(1_790_000_000_000) // 2026-09-21, the broker clock's start
	frMaxTS    = int64(1) << 45
	frMaxSteps = 400 // records per program, re-routes included
)

// The program's operations (op byte mod frOps).
const (
	opRecord  = iota // partition, clock step, key, value, headers, padding
	opCopy           // an earlier input again: index, partition, clock step
	opCommit         // commit every open transaction
	opAbort          // abort every open transaction and process its records again
	opRestore        // commit, then restore a partition from its changelog
	opDeliver        // deliver the committed re-routes to their partitions
	opTick           // a tick signed by dedup on a partition, after a clock step
	opEvent          // a well-formed event from a few bytes: copies are likely
	frOps
)

type recordHarness struct {
	t     *testing.T
	reg   *prometheus.Registry
	pr    *processor
	parts [frEvents]*stream.Local
	// open: each partition's records in its open transaction.
	open    [frEvents][]*kgo.Record
	offsets [frEvents]int64
	now     int64
	inputs  []*kgo.Record // every record given, for opCopy
	// reroutes: committed re-routed records not yet delivered.
	reroutes []*kgo.Record
	// deduped: each identity forwarded, its payload and arrival.
	deduped map[string]dedupedSeen
	// counts of committed outputs: accepted, duplicates, rejected by
	// reason, re-routed.
	accepted, duplicates, rerouted int
	rejected                       map[string]int
	steps                          int
	// aborted: the outputs of each aborted attempt of the open
	// transactions.
	aborted [frEvents][][]*kgo.Record
	// noRestore: opRestore only commits. restored: a partition was
	// restored. outputs: each partition's committed outputs but
	// watermarks, to compare a run with restores with one without.
	noRestore, restored bool
	outputs             [frEvents][]*kgo.Record
	// wm is each partition's watermark (its largest broker timestamp),
	// wmAt the watermark when each input was read.
	wm   [frEvents]int64
	wmAt map[coord]int64
	// delivered: the inputs that are re-routes dedup wrote.
	delivered map[coord]bool
}

type dedupedSeen struct {
	payload string
	arrival int64
}

func newRecordHarness(t *testing.T) *recordHarness {
	reg := prometheus.NewRegistry()
	cfg := Config{Window: frWindow, Skew: frSkew, Bucket: frBucket, Keys: []Key{fuzzKey}}
	cfg.Stream.Registerer = reg
	cfg.Stream.InstanceID = "fuzz"
	cfg.EnsureDefaults()
	pr, err := newProcessor(cfg, partitionCountsT{events: frEvents, deduped: frDeduped, duplicates: 2, rejected: 2}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	pr.endOffset = func(int32) (int64, error) { return 0, nil }
	pr.eventsRetention = func() (time.Duration, error) { return -1, nil }
	return &recordHarness{t: t, reg: reg, pr: pr, now: frStart, deduped: map[string]dedupedSeen{}, rejected: map[string]int{},
		delivered: map[coord]bool{}, wmAt: map[coord]int64{}}
}

func (h *recordHarness) close() {
	for _, l := range h.parts {
		if l != nil {
			_ = l.Close()
		}
	}
}

func (h *recordHarness) local(p int32) *stream.Local {
	if h.parts[p] == nil {
		l, err := stream.NewLocal(h.pr, p, h.pr.eventsTopic)
		if err != nil {
			h.t.Fatalf("open partition %d: %v", p, err)
		}
		l.Keep()
		h.parts[p] = l
	}
	return h.parts[p]
}

// progReader reads a program; past its end every read is zero.
type progReader struct{ b []byte }

func (r *progReader) done() bool { return len(r.b) == 0 }

func (r *progReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *progReader) u16() int {
	return int(r.byte())<<8 | int(r.byte())
}

func (r *progReader) bytes(n int) []byte {
	n = min(n, len(r.b))
	b := bytes.Clone(r.b[:n])
	r.b = r.b[n:]
	return b
}

// step moves the broker clock by a signed number of minutes (a clock that
// steps back included).
func (h *recordHarness) step(r *progReader) {
	d := int64(int16(r.u16())) * int64(time.Minute/time.Millisecond)
	h.now = min(max(h.now+d, 1), frMaxTS)
}

func (h *recordHarness) run(prog []byte) {
	r := &progReader{b: prog}
	for !r.done() && h.steps < frMaxSteps {
		switch r.byte() % frOps {
		case opRecord:
			h.opRecord(r)
		case opCopy:
			if len(h.inputs) == 0 {
				continue
			}
			in := h.inputs[int(r.byte())%len(h.inputs)]
			p := int32(r.byte()) % frEvents
			h.step(r)
			h.give(&kgo.Record{Partition: p, Key: in.Key, Value: in.Value, Headers: in.Headers})
		case opCommit:
			h.commit()
		case opAbort:
			h.abort()
		case opRestore:
			h.commit()
			if p := int32(r.byte()) % frEvents; !h.noRestore {
				h.restore(p)
			}
		case opDeliver:
			h.deliver()
		case opTick:
			p := int32(r.byte()) % frEvents
			h.step(r)
			h.give(&kgo.Record{Partition: p, Value: h.pr.tickValue, Headers: h.pr.keys.tickHeaders(h.pr.eventsTopic, p, h.pr.tickValue)})
		case opEvent:
			h.opEvent(r)
		}
	}
	// The end: everything committed, every re-route delivered (a
	// delivered re-route is never re-routed again, so this ends).
	for i := 0; i < 3; i++ {
		h.commit()
		h.deliver()
	}
	h.commit()
	if len(h.reroutes) > 0 {
		h.t.Fatalf("%d re-routed records still re-routed after two deliveries", len(h.reroutes))
	}
	h.checkMetrics()
}

// opRecord gives a raw record: partition, clock step, key (length 255:
// none), value, headers, and padding of the value or the key by KiB.
func (h *recordHarness) opRecord(r *progReader) {
	p := int32(r.byte()) % frEvents
	h.step(r)
	var key []byte
	if n := r.byte(); n != 255 {
		key = r.bytes(int(n))
	}
	val := r.bytes(r.u16())
	var hs []kgo.RecordHeader
	for n := r.byte() % 8; n > 0; n-- {
		k := string(r.bytes(int(r.byte())))
		switch k { // short names for dedup's headers
		case "R":
			k = HeaderRerouted
		case "A":
			k = HeaderArrival
		case "S":
			k = HeaderAuth
		}
		hs = append(hs, kgo.RecordHeader{Key: k, Value: r.bytes(r.u16())})
	}
	switch pad := int(r.byte()); {
	case pad >= 0x80: // the key, by KiB of '0'
		key = append(key, bytes.Repeat([]byte{'0'}, (pad&0x7f)<<10)...)
	case pad > 0: // the value, by KiB of zeros
		val = append(val, make([]byte, pad<<10)...)
	}
	h.give(&kgo.Record{Partition: p, Key: key, Value: val, Headers: hs})
}

// opEvent gives a well-formed event, correctly keyed and placed, from a
// few bytes: customer and event ID of a small set, so that copies and
// conflicting copies are frequent; quantity; event time relative to the
// clock, in minutes.
func (h *recordHarness) opEvent(r *progReader) {
	c, id, q := r.byte(), r.byte(), r.byte()
	h.step(r)
	et := h.now + int64(int8(r.byte()))*int64(time.Hour/time.Millisecond)/4
	e := &schemas.UsageEvent{EventID: fmt.Sprintf("e%d", id%16), CustomerID: fmt.Sprintf("c%d", c%4), Meter: "m",
		Quantity: int64(q % 4), EventTime: et, Source: "fuzz"}
	key := e.Identity().Key()
	h.give(&kgo.Record{Partition: schemas.Partition(key, frEvents), Key: key, Value: schemas.MustEncode(e)})
}

// give processes a record at the broker clock on its partition, in the
// partition's open transaction.
func (h *recordHarness) give(rec *kgo.Record) {
	h.steps++
	rec.Topic, rec.Offset, rec.Timestamp = h.pr.eventsTopic, h.offsets[rec.Partition], time.UnixMilli(h.now)
	h.offsets[rec.Partition]++
	h.wm[rec.Partition] = max(h.wm[rec.Partition], h.now)
	h.wmAt[coord{rec.Partition, rec.Offset}] = h.wm[rec.Partition]
	h.inputs = append(h.inputs, rec)
	h.open[rec.Partition] = append(h.open[rec.Partition], rec)
	if err := h.local(rec.Partition).Process([]*kgo.Record{rec}); err != nil {
		h.t.Fatalf("partition %d offset %d: Process: %v", rec.Partition, rec.Offset, err)
	}
}

func (h *recordHarness) commit() {
	for p := range h.parts {
		if h.parts[p] == nil || len(h.open[p]) == 0 {
			continue
		}
		l := h.parts[p]
		if err := l.Commit(); err != nil {
			h.t.Fatalf("partition %d: commit: %v", p, err)
		}
		outs := l.TakeOutput()
		h.outputs[p] = append(h.outputs[p], h.noWatermarks(outs)...)
		h.checkReplayed(int32(p), h.aborted[p], outs)
		h.check(int32(p), h.open[p], outs)
		h.open[p], h.aborted[p] = nil, nil
	}
}

// abort aborts every open transaction and processes its records again in
// a new one, as the runtime does from the committed offset.
func (h *recordHarness) abort() {
	for p := range h.parts {
		if h.parts[p] == nil || len(h.open[p]) == 0 {
			continue
		}
		h.aborted[p] = append(h.aborted[p], h.parts[p].Abort())
		if err := h.parts[p].Process(h.open[p]); err != nil {
			h.t.Fatalf("partition %d: Process after an abort: %v", p, err)
		}
	}
}

// restore replaces partition p's store by one restored from its
// changelog.
func (h *recordHarness) restore(p int32) {
	old := h.parts[p]
	if old == nil {
		return
	}
	cl := old.Changelog()
	if err := old.Close(); err != nil {
		h.t.Fatal(err)
	}
	h.parts[p] = nil
	l, err := stream.RestoreLocal(h.pr, p, h.pr.eventsTopic, cl)
	if err != nil {
		h.t.Fatalf("restore partition %d from its changelog: %v", p, err)
	}
	h.parts[p] = l
	h.restored = true
}

// deliver gives the committed re-routes to their partitions, stamped by
// the broker clock.
func (h *recordHarness) deliver() {
	rs := h.reroutes
	h.reroutes = nil
	for _, r := range rs {
		if h.steps >= frMaxSteps*2 {
			return
		}
		rec := &kgo.Record{Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
		h.give(rec)
		h.delivered[coord{rec.Partition, rec.Offset}] = true
	}
}

// fuzzRecordSeeds builds the seed programs.
func fuzzRecordSeeds(tb testing.TB) [][]byte {
	b := &progBuilder{}
	ev := func(c, m, id string, q, et int64) *schemas.UsageEvent {
		return &schemas.UsageEvent{EventID: id, CustomerID: c, Meter: m, Quantity: q, EventTime: et, Source: "svc"}
	}
	placed := func(e *schemas.UsageEvent) (int32, []byte, []byte) {
		k := e.Identity().Key()
		return schemas.Partition(k, frEvents), k, schemas.MustEncode(e)
	}
	v0, err := os.ReadFile("../schemas/testdata/usage_event.v0.hex")
	if err != nil {
		tb.Fatal(err)
	}
	old, err := hex.DecodeString(strings.TrimSpace(string(v0)))
	if err != nil {
		tb.Fatal(err)
	}
	var seeds [][]byte
	add := func(fn func()) {
		b.reset()
		fn()
		seeds = append(seeds, b.bytes())
	}
	at := frStart
	// Copies, a conflicting copy, an abort processed again, a restore.
	add(func() {
		p, k, v := placed(ev("acme", "api_calls", "req-1", 3, at))
		b.record(p, 0, k, v, nil, 0)
		b.record(p, 1, k, v, nil, 0)
		_, _, v2 := placed(ev("acme", "api_calls", "req-1", 4, at))
		b.record(p, 1, k, v2, nil, 0)
		b.op(opAbort)
		b.op(opCommit)
		b.op(opRestore, byte(p))
		b.record(p, 1, k, v, nil, 0)
		b.op(opCopy, 0, byte(p), 0, 1)
	})
	// An event of the first schema version, and its copy.
	add(func() {
		e, err := schemas.Decode(old)
		if err != nil {
			tb.Fatal(err)
		}
		u := e.(*schemas.UsageEvent)
		b.advance(frStart, u.EventTime)
		k := u.Identity().Key()
		b.record(schemas.Partition(k, frEvents), 0, k, old, nil, 0)
		b.record(schemas.Partition(k, frEvents), 5, k, old, nil, 0)
	})
	// Misrouted: wrong partition, no key, another key; delivered, then a
	// copy at its canonical place.
	add(func() {
		p, k, v := placed(ev("acme", "m", "x", 1, at))
		b.record((p+1)%frEvents, 0, k, v, nil, 0)
		b.record(p, 0, nil, v, nil, 0)
		b.record(p, 0, []byte("4:acme1:m1:y"), v, nil, 0)
		b.op(opCommit)
		b.op(opDeliver)
		b.record(p, 2, k, v, nil, 0)
		b.op(opAbort)
	})
	// Forged and odd headers: unsigned re-route headers, repeated ones, a
	// bogus signature, many and large headers.
	add(func() {
		p, k, v := placed(ev("acme", "m", "h", 1, at))
		b.record(p, 0, k, v, []kgo.RecordHeader{{Key: "R", Value: []byte("0/0")}, {Key: "A", Value: []byte("1")}}, 0)
		b.record(p, 0, k, v, []kgo.RecordHeader{{Key: "R", Value: []byte("1/9")}, {Key: "A", Value: []byte("1790000000000")},
			{Key: "S", Value: []byte("v1:k1:AAAA")}, {Key: "A", Value: []byte("2")}}, 0)
		b.record(p, 0, k, v, []kgo.RecordHeader{{Key: "x", Value: bytes.Repeat([]byte{0xff}, 60000)}, {Key: "", Value: nil},
			{Key: "\x00\xff", Value: []byte("y")}}, 0)
		b.record(p, 0, nil, []byte("tick?"), []kgo.RecordHeader{{Key: "S", Value: []byte("v1:k1:")}}, 0)
	})
	// Oversized key and value; undecodable bytes; a bogus fingerprint; a
	// record of another kind; unsigned and signed ticks.
	add(func() {
		p, k, v := placed(ev("acme", "m", "big", 1, at))
		b.record(p, 0, k, v, nil, 20)
		b.record(p, 0, bytes.Repeat([]byte("k"), 250), v, nil, 0)
		b.record(p, 0, k, v, nil, 0x80|17)
		b.record(0, 0, nil, []byte{0xc3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0}, nil, 0)
		b.record(1, 0, []byte("k"), []byte{0xc3, 0x01}, nil, 0)
		b.record(2, 0, nil, []byte("not avro"), nil, 0)
		b.record(0, 0, nil, v[:len(v)-3], nil, 0)
		b.record(1, 0, nil, schemas.MustEncode(&schemas.Watermark{SourcePartition: 1, SourcePartitions: 3, Watermark: at}), nil, 0)
		b.record(2, 0, nil, schemas.MustEncode(&schemas.Tick{InstanceID: "other"}), nil, 0)
		b.op(opTick, 0, 0, 1)
		b.op(opTick, 0, 0, 0)
		b.op(opTick, 0, 0, 1)
	})
	// Times: too old, in the future, then the clock past W + S and a copy
	// of an expired key; the broker clock stepping back.
	add(func() {
		_, _, _ = placed(ev("acme", "m", "t", 1, at))
		p, k, v := placed(ev("acme", "m", "t", 1, at))
		b.record(p, 0, k, v, nil, 0)
		po, ko, vo := placed(ev("acme", "m", "old", 1, at-3*24*3600_000))
		b.record(po, 0, ko, vo, nil, 0)
		pf, kf, vf := placed(ev("acme", "m", "future", 1, at+2*3600_000))
		b.record(pf, 0, kf, vf, nil, 0)
		b.op(opCommit)
		b.op(opTick, byte(p), 0x0f, 0xa0) // +4000 min
		b.record(p, 0, k, v, nil, 0)
		b.op(opAbort)
		b.op(opRestore, byte(p))
		b.record(p, 0xfc, k, v, nil, 0) // −4 × 256 min
		b.op(opEvent, 1, 2, 3, 0, 0, 0)
		b.op(opEvent, 1, 2, 3, 0xff, 0x00, 0)
	})
	// An aborted transaction whose clock step expired keys after its
	// first record: processed again from the committed watermark, that
	// record is decided as before.
	add(func() {
		p, k, v := placed(ev("acme", "m", "w", 1, at))
		b.record(p, 0, k, v, nil, 0)
		b.op(opCommit)
		p2, k2, v2 := placed(ev("acme", "m", "w2", 1, at))
		b.record(p2, 1, k2, v2, nil, 0)
		b.op(opTick, byte(p2), 0x1c, 0x20) // +7200 min
		b.op(opAbort)
		b.record(p, 0, k, v, nil, 0)
		b.op(opAbort)
	})
	// A misrouted conflicting copy that arrived within W of its original,
	// delivered after the original's key expired (docs/design.md, Known
	// limits), and an exact copy delivered alike (too_old).
	add(func() {
		o := ev("acme", "m", "late", 1, at)
		p, k, v := placed(o)
		b.record(p, 0, k, v, nil, 0)
		b.op(opCommit)
		c := *o
		c.Quantity, c.EventTime = 2, at+10*3600_000
		b.record((p+1)%frEvents, 47*60, k, schemas.MustEncode(&c), nil, 0)
		b.record((p+2)%frEvents, 0, k, v, nil, 0)
		b.op(opCommit)
		b.op(opTick, byte(p), 480>>8, 480&0xff)
		b.op(opCommit)
		b.op(opDeliver)
	})
	// A restore after the original's key expired, then a conflicting
	// copy: it finds no key, as in the store that dropped it.
	add(func() {
		o := ev("acme", "m", "gone", 1, at)
		p, k, v := placed(o)
		b.record(p, 0, k, v, nil, 0)
		b.op(opCommit)
		b.op(opTick, byte(p), 3300>>8, 3300&0xff)
		b.op(opRestore, byte(p))
		c := *o
		c.Quantity, c.EventTime = 2, at+50*3600_000
		b.record(p, 0, k, schemas.MustEncode(&c), nil, 0)
	})
	// Invalid UTF-8, control characters, empty and long identity fields.
	add(func() {
		for _, e := range []*schemas.UsageEvent{ev("ac\xffme", "m", "u", 1, at), ev("acme", "m\x01", "u", 1, at),
			ev("acme", "m", "", 1, at), ev(strings.Repeat("c", 300), "m", "u", 1, at), ev("acme", "m", "u", -1, at),
			{EventID: "p", CustomerID: "acme", Meter: "m", Quantity: 1, EventTime: at, Source: "s\x00",
				Properties: []schemas.Property{{Name: "a", Value: "\xc0"}}}} {
			k := schemas.AppendFramed(nil, e.CustomerID, e.Meter, e.EventID)
			v, err := schemas.Encode(e)
			if err != nil {
				tb.Fatal(err)
			}
			b.record(schemas.Partition(k, frEvents), 0, k, v, nil, 0)
		}
	})
	// Short events: copies and conflicts among a few identities, with
	// aborts and restores.
	add(func() {
		for i := 0; i < 12; i++ {
			b.op(opEvent, byte(i%2), byte(i%3), byte(i%4/2), 0, byte(i), 0)
			switch i % 4 {
			case 1:
				b.op(opAbort)
			case 2:
				b.op(opCommit)
			case 3:
				b.op(opRestore, byte(i))
			}
		}
	})
	return seeds
}

// progBuilder writes programs for run.
type progBuilder struct{ b []byte }

func (b *progBuilder) reset()        { b.b = nil }
func (b *progBuilder) bytes() []byte { return bytes.Clone(b.b) }

func (b *progBuilder) op(op byte, args ...byte) {
	b.b = append(append(b.b, op), args...)
}

// advance writes signed ticks on partition 0 that move the clock from
// `from` to `to` (epoch ms).
func (b *progBuilder) advance(from, to int64) {
	for m := (to - from) / 60_000; m != 0; {
		step := min(max(m, -30000), 30000)
		b.op(opTick, 0)
		b.b = binary.BigEndian.AppendUint16(b.b, uint16(int16(step)))
		m -= step
	}
}

// record writes an opRecord: step in minutes.
func (b *progBuilder) record(p int32, step int16, key, val []byte, hs []kgo.RecordHeader, pad byte) {
	b.b = append(b.b, opRecord, byte(p))
	b.b = binary.BigEndian.AppendUint16(b.b, uint16(step))
	if key == nil {
		b.b = append(b.b, 255)
	} else {
		key = key[:min(len(key), 254)]
		b.b = append(append(b.b, byte(len(key))), key...)
	}
	b.b = binary.BigEndian.AppendUint16(b.b, uint16(len(val)))
	b.b = append(b.b, val...)
	b.b = append(b.b, byte(len(hs)))
	for _, h := range hs {
		b.b = append(append(b.b, byte(len(h.Key))), h.Key...)
		b.b = binary.BigEndian.AppendUint16(b.b, uint16(len(h.Value)))
		b.b = append(b.b, h.Value...)
	}
	b.b = append(b.b, pad)
}

// sha is SHA-256 of b, nil for nil.
func sha(b []byte) []byte {
	if b == nil {
		return nil
	}
	s := sha256.Sum256(b)
	return s[:]
}

type coord struct {
	p int32
	o int64
}

// check checks the outputs of partition p's committed transaction, which
// consumed ins.
func (h *recordHarness) check(p int32, ins []*kgo.Record, outs []*kgo.Record) {
	t := h.t
	byCoord := make(map[coord]*kgo.Record, len(ins))
	seen := make(map[coord]int, len(ins))
	for _, in := range ins {
		byCoord[coord{in.Partition, in.Offset}] = in
	}
	account := func(c coord, what string) *kgo.Record {
		in, ok := byCoord[c]
		if !ok {
			t.Fatalf("partition %d: a %s names partition %d offset %d, which the transaction did not consume", p, what, c.p, c.o)
		}
		if seen[c]++; seen[c] > 1 {
			t.Fatalf("partition %d offset %d: more than one output (the second a %s)", c.p, c.o, what)
		}
		return in
	}
	watermarks := 0
	for _, out := range outs {
		if n := recordBytes(out); n > h.pr.cfg.MaxRecordBytes {
			t.Fatalf("an output to %s of %d bytes, more than MaxRecordBytes", out.Topic, n)
		}
		switch out.Topic {
		case h.pr.dedupedTopic:
			if h.checkDeduped(out, account) {
				watermarks++
			}
		case h.pr.duplicatesTopic:
			var d schemas.Duplicate
			if err := schemas.DecodeInto(out.Value, &d); err != nil {
				t.Fatalf("a duplicate does not decode: %v", err)
			}
			in := account(coord{d.DuplicatePartition, d.DuplicateOffset}, "duplicate")
			k := schemas.AppendFramed(nil, d.CustomerID, d.Meter, d.EventID)
			if !bytes.Equal(out.Key, k) || !bytes.Equal(in.Key, k) || out.Partition != schemas.Partition(k, h.pr.counts.duplicates) {
				t.Fatalf("duplicate of %q keyed %q on partition %d (input key %q)", k, out.Key, out.Partition, in.Key)
			}
			h.duplicates++
		case h.pr.rejectedTopic:
			var rj schemas.Rejected
			if err := schemas.DecodeInto(out.Value, &rj); err != nil {
				t.Fatalf("a rejection does not decode: %v", err)
			}
			h.checkRejected(&rj, account(coord{rj.SourcePartition, rj.SourceOffset}, "rejection"))
		case h.pr.eventsTopic:
			h.checkRerouted(out, account)
		default:
			t.Fatalf("an output to %s", out.Topic)
		}
	}
	ticks := 0
	for _, in := range ins {
		if seen[coord{in.Partition, in.Offset}] == 1 {
			continue
		}
		if m, err := schemas.Decode(in.Value); err != nil || m.Kind() != schemas.KindTick {
			t.Fatalf("partition %d offset %d (key %q, %d value bytes): no output; only a tick has none", in.Partition, in.Offset, in.Key, len(in.Value))
		}
		ticks++
	}
	if watermarks > ticks*frDeduped {
		t.Fatalf("%d watermark records from %d ticks", watermarks, ticks)
	}
}

// checkReplayed: the records processed again after an abort give the
// outputs they gave before (docs/design.md, Time: replays produce
// byte-identical records), but for watermarks (an abort forgets when a
// tick last forwarded one): each aborted attempt's outputs begin the
// committed ones.
func (h *recordHarness) checkReplayed(p int32, attempts [][]*kgo.Record, outs []*kgo.Record) {
	got := h.noWatermarks(outs)
	for i, a := range attempts {
		a = h.noWatermarks(a)
		if len(a) > len(got) {
			h.t.Fatalf("partition %d: aborted attempt %d emitted %d records, processed again %d", p, i, len(a), len(got))
		}
		for j := range a {
			x, y := a[j], got[j]
			if !sameRecord(x, y) {
				h.t.Fatalf("partition %d: output %d of aborted attempt %d (%s/%d key %q) differs when processed again (%s/%d key %q)",
					p, j, i, x.Topic, x.Partition, x.Key, y.Topic, y.Partition, y.Key)
			}
		}
	}
}

// noWatermarks returns recs without usage.deduped's watermark records
// (those without a key).
func (h *recordHarness) noWatermarks(recs []*kgo.Record) []*kgo.Record {
	var out []*kgo.Record
	for _, r := range recs {
		if r.Topic == h.pr.dedupedTopic && r.Key == nil {
			continue
		}
		out = append(out, r)
	}
	return out
}

// checkDeduped checks a usage.deduped record and reports whether it is a
// watermark.
func (h *recordHarness) checkDeduped(out *kgo.Record, account func(coord, string) *kgo.Record) bool {
	t := h.t
	m, err := schemas.Decode(out.Value)
	if err != nil {
		t.Fatalf("a usage.deduped record does not decode: %v", err)
	}
	switch d := m.(type) {
	case *schemas.Watermark:
		if out.Key != nil || d.SourcePartitions != frEvents || d.Watermark <= 0 {
			t.Fatalf("watermark %+v keyed %q", d, out.Key)
		}
		return true
	case *schemas.DedupedEvent:
		in := account(coord{d.SourcePartition, d.SourceOffset}, "deduped event")
		e := &schemas.UsageEvent{EventID: d.EventID, CustomerID: d.CustomerID, Meter: d.Meter, Quantity: d.Quantity,
			EventTime: d.EventTime, Source: d.Source, Properties: d.Properties}
		if err := e.Validate(); err != nil {
			t.Fatalf("a deduped event that is not valid: %v", err)
		}
		k := e.Identity().Key()
		ck := schemas.CustomerKey(d.CustomerID)
		if !bytes.Equal(in.Key, k) || in.Partition != schemas.Partition(k, frEvents) {
			t.Fatalf("event %q deduped from key %q on partition %d: not its canonical key and partition", k, in.Key, in.Partition)
		}
		if !bytes.Equal(out.Key, ck) || out.Partition != schemas.Partition(ck, frDeduped) {
			t.Fatalf("deduped event of %q keyed %q on partition %d", d.CustomerID, out.Key, out.Partition)
		}
		ts := in.Timestamp.UnixMilli()
		if d.IngestTime > ts || d.IngestTime < ts-frWindow.Milliseconds() {
			t.Fatalf("ingest time %d outside [ts − W, ts] of broker timestamp %d", d.IngestTime, ts)
		}
		payload := fmt.Sprintf("%d/%d/%q", d.Quantity, d.EventTime, d.Properties)
		if was, ok := h.deduped[string(k)]; ok {
			// A conflicting copy read once its original's key may have
			// expired (W + S after the first arrival, by the partition
			// watermark) is forwarded (docs/design.md, Known limits).
			expired := h.wmAt[coord{in.Partition, in.Offset}] >= was.arrival+(frWindow+frSkew).Milliseconds()
			if was.payload == payload || abs(d.IngestTime-was.arrival) < frWindow.Milliseconds() && !expired {
				t.Fatalf("identity %q reached usage.deduped twice: arrivals %d and %d, payloads %s and %s", k, was.arrival, d.IngestTime, was.payload, payload)
			}
		}
		h.deduped[string(k)] = dedupedSeen{payload: payload, arrival: d.IngestTime}
		h.accepted++
		return false
	default:
		t.Fatalf("a %s in usage.deduped", m.Kind())
	}
	return false
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// dedupReasons are the reason codes dedup raises (docs/design.md, Bad
// input).
var dedupReasons = map[string]bool{schemas.ReasonUndecodable: true, schemas.ReasonUnknownSchema: true, schemas.ReasonInvalid: true,
	schemas.ReasonTooOld: true, schemas.ReasonInFuture: true, schemas.ReasonOversized: true}

func (h *recordHarness) checkRejected(rj *schemas.Rejected, in *kgo.Record) {
	t := h.t
	if !dedupReasons[rj.Reason] || rj.Stage != "dedup" || rj.Detail == "" {
		t.Fatalf("rejection with reason %q, stage %q, detail %q", rj.Reason, rj.Stage, rj.Detail)
	}
	if rj.SourceTopic != h.pr.eventsTopic || rj.SourceTimestamp != in.Timestamp.UnixMilli() {
		t.Fatalf("rejection from %s at %d, the input is from %s at %d", rj.SourceTopic, rj.SourceTimestamp, in.Topic, in.Timestamp.UnixMilli())
	}
	for _, c := range []struct {
		what        string
		raw, prefix []byte
		n           int64
		sum         []byte
	}{{"key", in.Key, rj.RawKey, rj.RawKeyLength, rj.RawKeySHA256}, {"value", in.Value, rj.RawValue, rj.RawValueLength, rj.RawValueSHA256}} {
		if c.n != int64(len(c.raw)) || !bytes.Equal(c.sum, sha(c.raw)) || !bytes.HasPrefix(c.raw, c.prefix) ||
			len(c.prefix) != min(len(c.raw), schemas.MaxRejectedRawBytes) {
			t.Fatalf("rejection (%s) carries the raw %s's length %d, digest %x and %d prefix bytes; it is %d bytes, digest %x",
				rj.Reason, c.what, c.n, c.sum, len(c.prefix), len(c.raw), sha(c.raw))
		}
	}
	h.rejected[rj.Reason]++
}

func (h *recordHarness) checkRerouted(out *kgo.Record, account func(coord, string) *kgo.Record) {
	t := h.t
	hd := scanHeaders(out.Headers)
	rr, ok := parseRerouted(&hd)
	if !ok || !hd.hasAuth {
		t.Fatalf("a re-routed record without signed re-route headers: %v", out.Headers)
	}
	in := account(coord{rr.origPartition, rr.origOffset}, "re-route")
	if h.delivered[coord{in.Partition, in.Offset}] {
		t.Fatalf("partition %d offset %d, a record dedup re-routed, re-routed again", in.Partition, in.Offset)
	}
	m, err := schemas.Decode(out.Value)
	e, ok := m.(*schemas.UsageEvent)
	if err != nil || !ok {
		t.Fatalf("a re-routed record that is not a usage event: %v", err)
	}
	k := e.Identity().Key()
	if !bytes.Equal(out.Value, in.Value) || !bytes.Equal(out.Key, k) || out.Partition != schemas.Partition(k, frEvents) {
		t.Fatalf("re-routed %q to %q on partition %d (canonical %q on %d; same value %v)", in.Key, out.Key, out.Partition, k, schemas.Partition(k, frEvents), bytes.Equal(out.Value, in.Value))
	}
	if ts := in.Timestamp.UnixMilli(); rr.arrival > ts || rr.arrival < ts-frWindow.Milliseconds() {
		t.Fatalf("re-routed with arrival %d outside [ts − W, ts] of broker timestamp %d", rr.arrival, ts)
	}
	h.rerouted++
	h.reroutes = append(h.reroutes, out)
}

// checkMetrics: the counters equal the committed outputs.
func (h *recordHarness) checkMetrics() {
	t := h.t
	for _, c := range []struct {
		name string
		want int
	}{{"meterline_dedup_accepted_total", h.accepted}, {"meterline_dedup_duplicates_total", h.duplicates},
		{"meterline_dedup_rerouted_total", h.rerouted}} {
		if got := metricSum(t, h.reg, c.name); got != float64(c.want) {
			t.Fatalf("%s is %v, the committed outputs %d", c.name, got, c.want)
		}
	}
	for k, v := range metricValues(t, h.reg, "meterline_rejected_total") {
		reason, _, _ := strings.Cut(strings.TrimPrefix(k, "reason="), ",")
		if v != float64(h.rejected[reason]) {
			t.Fatalf("meterline_rejected_total{%s} is %v, the committed rejections %d", k, v, h.rejected[reason])
		}
	}
}
