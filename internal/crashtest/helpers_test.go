package crashtest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// The suite's timings (crash.Suite), named as the tests use them.
const (
	partitions         = crash.Partitions
	sessionTimeout     = crash.SessionTimeout
	transactionTimeout = crash.TransactionTimeout
	exitTimeout        = crash.ExitTimeout
)

// suite is one test's world (crash.Suite: topics under its own prefix,
// the dedup group, state dirs, children), a producer, and the record of
// every copy the brokers acknowledged.
type suite struct {
	*crash.Suite
	t     *testing.T
	group string
	base  time.Time // event_time of identity 0; identity i is base + i ms

	prod *producer.Producer

	mu       sync.Mutex
	sent     map[string]int // identity key → copies acknowledged
	sendErrs int
	firstErr error
}

// newSuite makes the test's crash.Suite and a producer to usage.events.
func newSuite(t *testing.T) *suite {
	t.Helper()
	cs := crash.New(t, "crash")
	s := &suite{
		Suite: cs,
		t:     t,
		group: cs.Group("dedup"),
		base:  time.Now().Add(-time.Minute).Truncate(time.Millisecond),
		sent:  map[string]int{},
	}
	var err error
	s.prod, err = producer.New(producer.WithBrokers(cs.Brokers...), producer.WithTopic(cs.Names.EventsTopic()),
		producer.WithSource("crashtest"), producer.WithLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.prod.Close)
	return s
}

// event returns identity i's event; every copy of it is identical (an
// exact duplicate, not a conflict), with event_time about now − 1 min.
func (s *suite) event(i int) producer.Event {
	return producer.Event{
		EventID:    producer.EventID(s.Names.Prefix, strconv.Itoa(i)),
		CustomerID: fmt.Sprintf("cust-%02d", i%17),
		Meter:      "api_calls",
		Quantity:   int64(i%100 + 1),
		EventTime:  s.base.Add(time.Duration(i) * time.Millisecond),
	}
}

// sendAsync queues one copy of each identity; acknowledged copies are
// counted in s.sent. Call flush to wait for them.
func (s *suite) sendAsync(ids []int) {
	for _, i := range ids {
		key := string(s.event(i).Key())
		s.prod.SendAsync(s.event(i), func(err error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if err != nil {
				s.sendErrs++
				if s.firstErr == nil {
					s.firstErr = err
				}
				return
			}
			s.sent[key]++
		})
	}
}

// flush waits until every queued copy is acknowledged; a failed send fails
// the test (it would make the expected counts unknown).
func (s *suite) flush() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.prod.Flush(ctx); err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sendErrs > 0 {
		s.t.Fatalf("%d sends failed, first: %v", s.sendErrs, s.firstErr)
	}
}

// send sends one copy of each identity and waits for the acknowledgements.
func (s *suite) send(ids []int) {
	s.t.Helper()
	s.sendAsync(ids)
	s.flush()
}

// sentIDs returns how many copies and identities were acknowledged.
func (s *suite) sentCounts() (copies, identities int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.sent {
		copies += n
	}
	return copies, len(s.sent)
}

func seq(from, to int) []int {
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// feeder sends a batch of copies every interval on its own goroutine.
type feeder struct {
	s    *suite
	stop chan struct{}
	done chan struct{}
}

// feed starts sending next(round) every interval until Stop.
func (s *suite) feed(every time.Duration, next func(round int) []int) *feeder {
	f := &feeder{s: s, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for round := 0; ; round++ {
			s.sendAsync(next(round))
			select {
			case <-f.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return f
}

// Stop stops the feeder and waits for every copy it sent to be
// acknowledged.
func (f *feeder) Stop() {
	f.s.t.Helper()
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
	f.s.flush()
}

// ---- children ----

// opts are per-run overrides.
type opts struct {
	fault              string        // METERLINE_FAULT
	transactionTimeout time.Duration // default crash.TransactionTimeout
	args               []string      // more flags (a later one overrides the suite's)
}

// start runs `meterline dedup` as instance id with its state under
// stateDir (the Pebble dir is stateDir/dedup-<id>). It is killed when the
// test ends, and its log tail printed if the test failed.
func (s *suite) start(id, stateDir string, o opts) *testenv.Process {
	s.t.Helper()
	return s.Stage("dedup", id, stateDir, crash.StageOpts{Fault: o.fault, TransactionTimeout: o.transactionTimeout, Args: o.args})
}

// Log messages the suite looks for.
const (
	msgRestoring    = "restoring partition from the changelog"
	msgRestored     = "partition restored"
	msgFenced       = "transaction aborted: the group rebalanced or the commit was fenced; re-consuming from the committed offsets"
	msgUnknown      = "ending the transaction failed; outcome unknown"
	msgRecordFailed = "transaction aborted: the producer was fenced or lost its state; rebuilding the session"
	msgDropped      = "dropped from the consumer group; rejoining"
)

// waitCaughtUp waits until the group is caught up on usage.events
// (docs/operations.md, Lag, ticks aside: crash.CaughtUp), failing at once
// if one of the live children exits.
func (s *suite) waitCaughtUp(live ...*testenv.Process) {
	s.t.Helper()
	s.WaitCaughtUp(s.group, s.Names.EventsTopic(), live...)
}

// result is what the outputs hold.
type result struct {
	deduped    map[string]int // identity key → DedupedEvent records
	duplicates map[string]int // identity key → Duplicate records
	dupTotal   int
	conflicts  int
	watermarks int
	rejected   []*schemas.Rejected
}

// outputs reads usage.deduped, usage.duplicates and usage.rejected
// (read_committed, exactly up to their high watermarks).
func (s *suite) outputs() result {
	s.t.Helper()
	r := result{deduped: map[string]int{}, duplicates: map[string]int{}}
	for _, rec := range s.readAll(s.Names.DedupedTopic()) {
		k, err := schemas.PeekKind(rec.Value)
		if err != nil {
			s.t.Fatalf("usage.deduped %d/%d: %v", rec.Partition, rec.Offset, err)
		}
		switch k {
		case schemas.KindWatermark:
			r.watermarks++
		case schemas.KindDedupedEvent:
			var e schemas.DedupedEvent
			if err := schemas.DecodeInto(rec.Value, &e); err != nil {
				s.t.Fatal(err)
			}
			id := schemas.Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}
			r.deduped[string(id.Key())]++
		default:
			s.t.Fatalf("usage.deduped %d/%d holds a %s", rec.Partition, rec.Offset, k)
		}
	}
	for _, rec := range s.readAll(s.Names.DuplicatesTopic()) {
		var d schemas.Duplicate
		if err := schemas.DecodeInto(rec.Value, &d); err != nil {
			s.t.Fatal(err)
		}
		id := schemas.Identity{CustomerID: d.CustomerID, Meter: d.Meter, EventID: d.EventID}
		r.duplicates[string(id.Key())]++
		r.dupTotal++
		if d.Conflict {
			r.conflicts++
		}
	}
	for _, rec := range s.readAll(s.Names.RejectedTopic()) {
		var d schemas.Rejected
		if err := schemas.DecodeInto(rec.Value, &d); err != nil {
			s.t.Fatal(err)
		}
		r.rejected = append(r.rejected, &d)
	}
	return r
}

// checkExactlyOnce asserts the contract on everything acknowledged so
// far: each identity exactly once in usage.deduped (none lost, none
// twice, none invented), every other copy in usage.duplicates (per
// identity: copies − 1; none flagged conflict), nothing rejected.
func (s *suite) checkExactlyOnce() result {
	s.t.Helper()
	r := s.outputs()
	s.mu.Lock()
	sent := make(map[string]int, len(s.sent))
	for k, v := range s.sent {
		sent[k] = v
	}
	s.mu.Unlock()
	copies := 0
	for _, n := range sent {
		copies += n
	}
	var problems []string
	add := func(format string, args ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	lost, twice, wrongDups := 0, 0, 0
	for k, n := range sent {
		switch d := r.deduped[k]; {
		case d == 0:
			lost++
			add("%s: sent %d copies, never in usage.deduped (lost)", k, n)
		case d > 1:
			twice++
			add("%s: in usage.deduped %d times (accepted more than once)", k, d)
		}
		if r.duplicates[k] != n-1 {
			wrongDups++
			add("%s: sent %d copies, %d in usage.duplicates, want %d", k, n, r.duplicates[k], n-1)
		}
	}
	for k, d := range r.deduped {
		if _, ok := sent[k]; !ok {
			add("%s: in usage.deduped %d times but never sent", k, d)
		}
	}
	for k, d := range r.duplicates {
		if _, ok := sent[k]; !ok {
			add("%s: in usage.duplicates %d times but never sent", k, d)
		}
	}
	if r.conflicts > 0 {
		add("%d duplicates flagged conflict; every copy sent was identical", r.conflicts)
	}
	for i, rej := range r.rejected {
		if i < 3 {
			add("rejected: %s %s (%s/%d/%d)", rej.Reason, rej.Detail, rej.SourceTopic, rej.SourcePartition, rej.SourceOffset)
		}
	}
	if want := copies - len(sent); r.dupTotal != want {
		add("usage.duplicates holds %d copies, want copies sent − identities = %d − %d = %d", r.dupTotal, copies, len(sent), want)
	}
	if len(problems) > 0 {
		s.t.Fatalf("exactly-once broken: %d identities lost, %d accepted more than once, %d with wrong duplicate counts, %d rejected; first problems:\n  %s",
			lost, twice, wrongDups, len(r.rejected), strings.Join(problems, "\n  "))
	}
	s.t.Logf("exactly once: %d identities in usage.deduped, %d copies in usage.duplicates (%d copies sent), %d watermark records",
		len(sent), r.dupTotal, copies, r.watermarks)
	return r
}

// readAll reads every committed data record of the topic up to the high
// watermarks read now.
func (s *suite) readAll(topic string) []*kgo.Record {
	s.t.Helper()
	return testenv.ReadAll(s.t, s.Brokers, topic)
}
