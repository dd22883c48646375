package crashtest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// Timings of every child: short, so takeovers and aborts of dead
// instances' transactions happen within seconds.
const (
	partitions         = 4
	sessionTimeout     = 3 * time.Second
	transactionTimeout = 5 * time.Second
	rebalanceTimeout   = 10 * time.Second
	tickInterval       = 500 * time.Millisecond
	commitInterval     = 50 * time.Millisecond

	// caughtUpTimeout bounds every wait for the group to catch up.
	caughtUpTimeout = 2 * time.Minute
	// exitTimeout bounds every wait for a child to exit.
	exitTimeout = 90 * time.Second
)

// suite is one test's world: its own topics (prefix), group, state dirs,
// producer, children, and the record of every copy the brokers
// acknowledged.
type suite struct {
	t       *testing.T
	bin     string // the meterline binary
	brokers []string
	names   topics.Names
	group   string
	dir     string
	logs    string    // the children's logs, kept if the test fails
	keys    string    // the dedup key file every instance shares
	base    time.Time // event_time of identity 0; identity i is base + i ms

	prod *producer.Producer

	mu       sync.Mutex
	procs    []*testenv.Process
	sent     map[string]int // identity key → copies acknowledged
	sendErrs int
	firstErr error
	starts   map[string]int // instance → starts, for log names
}

// newSuite creates the topics with `meterline topics create` and a
// producer, and registers the cleanup: topics and group deleted. (The
// children that start runs are killed when the test ends; their logs are
// kept in s.logs if the test failed.)
func newSuite(t *testing.T) *suite {
	t.Helper()
	brokers := testenv.RealKafka(t)
	bin := testenv.Meterline(t)
	prefix := testenv.Name(t, "crash") + "."
	s := &suite{
		t:       t,
		bin:     bin,
		brokers: brokers,
		names:   topics.DefaultNames(),
		group:   prefix + "dedup",
		dir:     t.TempDir(),
		logs:    testenv.LogDir(t, "meterline-crashtest-logs-"),
		keys:    testenv.DedupKeysFile(t),
		base:    time.Now().Add(-time.Minute).Truncate(time.Millisecond),
		sent:    map[string]int{},
		starts:  map[string]int{},
	}
	s.names.Prefix = prefix

	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var ns []string
		for _, sp := range topics.Specs(s.names, topics.DefaultLayout()) {
			ns = append(ns, sp.Name)
		}
		_, _ = adm.DeleteGroups(ctx, s.group)
		_, _ = adm.DeleteTopics(ctx, ns...)
	})
	out, err := exec.Command(s.bin, "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", strconv.Itoa(partitions)).CombinedOutput()
	if err != nil {
		t.Fatalf("meterline topics create: %v\n%s", err, out)
	}

	s.prod, err = producer.New(producer.WithBrokers(brokers...), producer.WithTopic(s.names.EventsTopic()),
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
		EventID:    producer.EventID(s.names.Prefix, strconv.Itoa(i)),
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
	transactionTimeout time.Duration // default transactionTimeout
}

// start runs `meterline dedup` as instance id with its state under
// stateDir (the Pebble dir is stateDir/dedup-<id>). It is killed when the
// test ends, and its log tail printed if the test failed.
func (s *suite) start(id, stateDir string, o opts) *testenv.Process {
	s.t.Helper()
	s.mu.Lock()
	s.starts[id]++
	run := s.starts[id]
	s.mu.Unlock()
	txt := transactionTimeout
	if o.transactionTimeout > 0 {
		txt = o.transactionTimeout
	}
	args := []string{"dedup",
		"--brokers", strings.Join(s.brokers, ","),
		"--topic-prefix", s.names.Prefix,
		"--group", s.group,
		"--instance-id", id,
		"--state-dir", stateDir,
		"--metrics-addr", "127.0.0.1:0",
		"--tick-interval", tickInterval.String(),
		"--commit-interval", commitInterval.String(),
		"--session-timeout", sessionTimeout.String(),
		"--transaction-timeout", txt.String(),
		"--rebalance-timeout", rebalanceTimeout.String(),
		"--log-level", "info",
		"--dedup-keys-file", s.keys,
	}
	// The "duplicate dropped" lines are many and say little.
	p := testenv.StartProcessOpts(s.t, testenv.ProcessOpts{Fault: o.fault, MayDie: true, TailSkip: `"msg":"duplicate dropped"`, ExitTimeout: exitTimeout},
		fmt.Sprintf("%s#%d", id, run), filepath.Join(s.logs, fmt.Sprintf("%s-%d.log", id, run)), s.bin, args...)
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p
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

// waitCaughtUp waits until the group is caught up on usage.events (DESIGN
// §6.7: a read_committed fetch from the committed offsets returns no
// records), failing at once if one of the live children exits.
func (s *suite) waitCaughtUp(live ...*testenv.Process) {
	s.t.Helper()
	start := time.Now()
	deadline := start.Add(caughtUpTimeout)
	var lastErr error
	for {
		for _, p := range live {
			if p.Exited() {
				s.t.Fatalf("%s exited (%s) while waiting for the group to catch up\n%s", p.Name(), p.ExitString(), p.Tail(30))
			}
		}
		ok, err := s.caughtUp()
		if err == nil && ok {
			s.t.Logf("group caught up after %s", time.Since(start).Round(time.Millisecond))
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			s.t.Fatalf("group %s not caught up on %s after %s (last error: %v)\n%s", s.group, s.names.EventsTopic(), caughtUpTimeout, lastErr, s.lagReport())
		}
		time.Sleep(200 * time.Millisecond)
	}
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
	for _, rec := range s.readAll(s.names.DedupedTopic()) {
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
	for _, rec := range s.readAll(s.names.DuplicatesTopic()) {
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
	for _, rec := range s.readAll(s.names.RejectedTopic()) {
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

// ---- reading ----

// readAll reads every committed data record of the topic up to the high
// watermarks read now.
func (s *suite) readAll(topic string) []*kgo.Record {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := topics.ReadCommitted(ctx, s.brokers, topic, nil)
	if err != nil {
		s.t.Fatalf("reading %s: %v", topic, err)
	}
	return recs
}

// caughtUp reports whether a read_committed read of usage.events from the
// group's committed offsets returns no records (DESIGN §6.7) — other than
// ticks. Each instance appends a tick to each partition it owns every tick
// interval, and the broker answers a read_committed fetch waiting on a
// partition only at the fetch's max wait (500 ms) after the tick's commit
// marker, so a partition's last tick is unconsumed about half of the time.
// With one instance all its partitions clear together; with several, at
// phases of their own, a moment with no tick pending anywhere may never
// come. A tick carries no usage: every event below the high watermark
// is processed and committed when only ticks remain.
func (s *suite) caughtUp() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		return false, err
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, s.group)
	if err != nil {
		return false, err
	}
	topic := s.names.EventsTopic()
	from := map[int32]int64{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			from[o.Partition] = o.At
		}
	})
	recs, err := topics.ReadCommitted(ctx, s.brokers, topic, from)
	if err != nil {
		return false, err
	}
	for _, r := range recs {
		if k, err := schemas.PeekKind(r.Value); err != nil || k != schemas.KindTick {
			return false, nil
		}
	}
	return true, nil
}

// lagReport describes, per partition of usage.events, the group's
// committed offset, the last stable offset and high watermark, and the
// first records after the committed offset: for a failed wait.
func (s *suite) lagReport() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := s.names.EventsTopic()
	offs, err := adm.FetchOffsets(ctx, s.group)
	if err != nil {
		return "fetch offsets: " + err.Error()
	}
	lso, _ := adm.ListCommittedOffsets(ctx, topic)
	hw, _ := adm.ListEndOffsets(ctx, topic)
	from := map[int32]int64{}
	var b strings.Builder
	for p := int32(0); p < partitions; p++ {
		o, _ := offs.Lookup(topic, p)
		l, _ := lso.Lookup(topic, p)
		h, _ := hw.Lookup(topic, p)
		from[p] = o.At
		fmt.Fprintf(&b, "partition %d: committed %d (err %v), last stable %d, high watermark %d\n", p, o.At, o.Err, l.Offset, h.Offset)
	}
	recs, err := topics.ReadCommitted(ctx, s.brokers, topic, from)
	if err != nil {
		fmt.Fprintf(&b, "reading after the committed offsets: %v\n", err)
	}
	for i, r := range recs {
		if i == 20 {
			fmt.Fprintf(&b, "... %d records in all\n", len(recs))
			break
		}
		k, _ := schemas.PeekKind(r.Value)
		fmt.Fprintf(&b, "  %d/%d %s producer %d/%d ts %s key %q\n", r.Partition, r.Offset, k, r.ProducerID, r.ProducerEpoch, r.Timestamp.Format(time.RFC3339Nano), r.Key)
	}
	return b.String()
}
