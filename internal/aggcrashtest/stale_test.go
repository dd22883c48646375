package aggcrashtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/schemas"
)

// staleDeleteRetention is the aggregator changelog's delete.retention.ms
// in TestStaleStateAfterCompaction: short, so the broker removes
// tombstones within the test, and still long enough that a full restore
// of the test's changelog (a few hundred records) fits well inside it, as
// the restore horizon rule requires (docs/design.md, Exactly-once, 4).
const staleDeleteRetention = 4 * time.Second

// TestStaleStateAfterCompaction is issue 11's finding 3 on the real broker
// (docs/design.md, Exactly-once, 4). Instance a aggregates day P; the
// partitions move to b, which adds to P's aggregates, finalizes P (one
// FINAL each, and tombstones for the OPEN aggregates in the changelog) and
// keeps processing watermarks, while the broker compacts the changelog
// (segment.ms 200 ms, min.cleanable.dirty.ratio 0.01, delete.retention.ms
// 4 s, log.cleaner.backoff.ms 1 s on the test broker) until the tombstones
// are gone. Then the partitions return to a, on its old state. A replay of
// the tail from a's checkpoint misses the deletes, and a's next watermark
// finalizes P's aggregates a second time, with a's older values and a
// revision below b's FINAL. a must see that its checkpoint is past the
// horizon and restore in full: then every key has exactly one FINAL.
func TestStaleStateAfterCompaction(t *testing.T) {
	s := newSuite(t)
	changelog := s.Names.AggregateChangelogTopic()
	adm := testenv.Admin(t, s.Brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	set := func(k, v string) kadm.AlterConfig { return kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: &v} }
	resps, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{
		set("segment.ms", "200"),
		set("min.cleanable.dirty.ratio", "0.01"),
		set("min.compaction.lag.ms", "0"),
		set("delete.retention.ms", fmt.Sprint(staleDeleteRetention.Milliseconds())),
	}, changelog)
	for _, r := range resps {
		if err == nil && r.Err != nil {
			err = fmt.Errorf("%w: %s", r.Err, r.ErrMessage)
		}
	}
	if err != nil {
		t.Fatalf("alter %s: %v", changelog, err)
	}
	dir := func(id string) string { return filepath.Join(s.Dir, "state-"+id) }

	day := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	end := day + dayMs
	seq := 0
	events := func(at int64) []step {
		var out []step
		for c := 0; c < 8; c++ {
			for _, m := range []string{"s", "c"} {
				seq++
				e := &oracle.Event{ID: fmt.Sprintf("ev-%03d", seq), Customer: fmt.Sprintf("cust-%02d", c), Meter: m, Quantity: int64(10 + seq),
					EventTime: at + int64(seq)*60_000, Properties: map[string]string{"region": "eu", "user": "u1"}}
				e.Arrival = e.EventTime + 60_000
				out = append(out, step{ev: e})
			}
		}
		return out
	}
	watermarks := func(at int64) []step {
		var out []step
		for src := int32(0); src < partitions; src++ {
			out = append(out, step{wm: &schemas.Watermark{SourcePartition: src, SourcePartitions: partitions, Watermark: at}})
		}
		return out
	}

	// a: P's first events, P open.
	a := s.startAgg("a", dir("a"), aggOpts{})
	s.send(events(day + hourMs))
	s.send(watermarks(day + 3*hourMs))
	s.waitCaughtUp(a)
	a.Stop(t)

	// b: more of P, then P final; then watermarks only, one source at a
	// time, so the changelog keeps growing (segments roll, the cleaner
	// runs) until P's OPEN aggregates, tombstones included, are gone from
	// it.
	b := s.startAgg("b", dir("b"), aggOpts{})
	s.send(events(day + 6*hourMs))
	s.send(watermarks(end + graceMs + 1))
	s.waitCaughtUp(b)
	if put, del := openRecords(t, s, changelog, day); put == 0 || del == 0 {
		t.Fatalf("changelog before compaction: %d records and %d tombstones of P's OPEN aggregates, want both", put, del)
	}
	compactStart := time.Now()
	for i := int64(1); ; i++ {
		if b.Exited() {
			t.Fatalf("b exited: %s\n%s", b.ExitString(), b.Tail(30))
		}
		s.send([]step{{wm: &schemas.Watermark{SourcePartition: int32(i % partitions), SourcePartitions: partitions, Watermark: end + graceMs + 1 + i}}})
		time.Sleep(200 * time.Millisecond)
		if i%5 != 0 {
			continue
		}
		if put, del := openRecords(t, s, changelog, day); put+del == 0 {
			break
		}
		if time.Since(compactStart) > time.Minute {
			t.Fatalf("the broker did not compact P's OPEN aggregates (tombstones included) out of %s in a minute: is log.cleaner.backoff.ms short on the test broker (deploy/local/kafka/server.properties.template)?", changelog)
		}
	}
	t.Logf("tombstones of P's OPEN aggregates compacted away %s after they were written", time.Since(compactStart).Round(100*time.Millisecond))
	s.waitCaughtUp(b)
	b.Stop(t)

	// a again, on its old state; a later watermark moves its partitions'
	// watermark, which finalizes whatever OPEN aggregate of P it holds.
	a = s.startAgg("a", dir("a"), aggOpts{})
	s.send(watermarks(end + graceMs + 1_000_000))
	s.waitCaughtUp(a)
	a.Stop(t)

	// Exactly one FINAL per key, and revisions never go backwards.
	type rev struct {
		n     int64
		v     int64
		final bool
	}
	revs := map[string][]rev{}
	for _, r := range testenv.ReadAll(t, s.Brokers, s.Names.AggregatesTopic()) {
		var ag schemas.Aggregate
		if err := schemas.DecodeInto(r.Value, &ag); err != nil {
			t.Fatal(err)
		}
		k := ag.CustomerID + "/" + ag.Meter
		revs[k] = append(revs[k], rev{n: ag.Revision, v: ag.Value, final: ag.Status == schemas.StatusFinal})
	}
	var errs []string
	for k, rs := range revs {
		var first *rev
		for i := range rs {
			r := &rs[i]
			if i > 0 && r.n <= rs[i-1].n {
				errs = append(errs, fmt.Sprintf("%s: revision %d (value %d) after revision %d (value %d): the revision went backwards", k, r.n, r.v, rs[i-1].n, rs[i-1].v))
			}
			if !r.final {
				continue
			}
			if first != nil {
				errs = append(errs, fmt.Sprintf("%s: a second FINAL, revision %d value %d, after FINAL revision %d value %d", k, r.n, r.v, first.n, first.v))
				continue
			}
			first = r
		}
	}
	if len(revs) != 16 {
		errs = append(errs, fmt.Sprintf("%d aggregates in %s, want 16", len(revs), s.Names.AggregatesTopic()))
	}
	if len(errs) > 0 {
		t.Fatalf("a restored stale state (docs/design.md, Exactly-once, 4):\n  %s", strings.Join(errs, "\n  "))
	}

	// How a restored: in full, each partition, because of the horizon.
	var plans []string
	for _, l := range a.Lines("restoring partition from the changelog") {
		plans = append(plans, fmt.Sprintf("%d:%v/%v", l.Int("partition"), l.Fields["kind"], l.Fields["reason"]))
	}
	if len(plans) != partitions || strings.Count(strings.Join(plans, " "), "full/horizon") != partitions {
		t.Errorf("a's restores on its return: %v, want %d partitions restored full/horizon", plans, partitions)
	}
	s.check(oracle.Day, graceMs)
}

// openRecords counts the changelog's records of P's OPEN aggregates (state
// keys 'a' P K): values and tombstones.
func openRecords(t *testing.T, s *suite, changelog string, period int64) (put, del int) {
	t.Helper()
	pre := make([]byte, 9)
	pre[0] = 'a'
	binary.BigEndian.PutUint64(pre[1:], uint64(period))
	for _, r := range testenv.ReadAll(t, s.Brokers, changelog) {
		if !bytes.HasPrefix(r.Key, pre) {
			continue
		}
		if r.Value == nil {
			del++
		} else {
			put++
		}
	}
	return put, del
}
