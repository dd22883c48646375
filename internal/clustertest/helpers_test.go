package clustertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// Timings of every stage instance: short enough that takeovers happen
// within seconds, long enough that a loaded 2-core machine with three
// brokers does not drop healthy members.
const (
	partitions         = 6
	sessionTimeout     = 6 * time.Second
	transactionTimeout = 10 * time.Second
	rebalanceTimeout   = 20 * time.Second
	tickInterval       = 500 * time.Millisecond
	commitInterval     = 100 * time.Millisecond

	exitTimeout     = 90 * time.Second
	caughtUpTimeout = 5 * time.Minute
	healthyTimeout  = 4 * time.Minute

	dayMs = int64(24 * time.Hour / time.Millisecond)
)

// long reports whether the long version runs (make chaos).
func long() bool { return os.Getenv("METERLINE_TEST_CHAOS") == "long" }

// The stages, each its own consumer group of instances i1, i2, ...
var stages = []string{"dedup", "aggregate", "sink"}

// suite is one test's world: its topics (unique prefix, replication factor
// 3, min.insync.replicas 2), groups, ClickHouse database, state dirs, the
// stage instances and the billing parameters.
type suite struct {
	t       *testing.T
	cluster *testenv.Cluster
	brokers []string
	bin     string
	names   topics.Names
	dir     string
	logs    string
	keys    string
	chAddr  string
	db      string
	ch      driver.Conn

	// Billing: day periods; P is yesterday, and its end + grace (cutoff)
	// falls during the load, so that P's FINAL is decided under the
	// faults, events of P sent before it are on time and those after it
	// are adjustments.
	periodP int64 // ms
	cutoff  int64 // ms
	grace   time.Duration
	// entWritten is a time after the entitlements' broker times (ms).
	entWritten int64
	// watermarks is the aggregator's watermark of each usage.deduped
	// partition (ms) once it has emitted everything due (waitFinalsOut),
	// with dedup stopped: the broker time its outputs end at.
	watermarks map[int32]int64

	mu     sync.Mutex
	live   map[string]*testenv.Process // "dedup/i1" → its current process
	killed map[*testenv.Process]bool   // killed or stopped by the test
	starts map[string]int
	// selfExits are the instances that exited without the test causing
	// it (checkAlive).
	selfExits []string
	exitsOf   map[string]int

	// journal is the test's own account in the logs directory (test.log,
	// kept with the children's logs when the test fails): every action on
	// an instance and every failed invariant, with the time, so that a
	// failure can be read against the children's logs even without the
	// go test output.
	journalMu sync.Mutex
	journal   *os.File
}

func newSuite(t *testing.T, cutoffIn time.Duration) *suite {
	t.Helper()
	cluster := testenv.RealCluster(t)
	chAddr := testenv.RealClickHouse(t)
	ch, db := testenv.ClickHouseDB(t)
	bin := testenv.Meterline(t)
	prefix := testenv.Name(t, "chaos") + "."
	s := &suite{t: t, cluster: cluster, brokers: cluster.Brokers, bin: bin, names: topics.DefaultNames(),
		dir: t.TempDir(), logs: testenv.LogDir(t, "meterline-clustertest-logs-"), keys: testenv.DedupKeysFile(t),
		chAddr: chAddr, db: db, ch: ch,
		live: map[string]*testenv.Process{}, killed: map[*testenv.Process]bool{}, starts: map[string]int{}, exitsOf: map[string]int{}}
	s.names.Prefix = prefix
	if j, err := os.Create(filepath.Join(s.logs, "test.log")); err == nil {
		s.journal = j
		t.Cleanup(func() {
			if t.Failed() {
				s.note("the test failed: its failures are the lines marked FAIL above")
			}
			s.journalMu.Lock()
			defer s.journalMu.Unlock()
			_ = s.journal.Close()
			s.journal = nil
		})
	}

	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteGroups(ctx, s.group("dedup"), s.group("aggregate"), s.group("sink"))
		_, _ = adm.DeleteTopics(ctx, s.topicNames()...)
	})
	// The command an operator runs: on three brokers it must choose
	// replication factor 3 and min.insync.replicas 2 by itself.
	out := s.command("topics", "create", "--brokers", strings.Join(s.brokers, ","), "--topic-prefix", prefix,
		"--partitions", strconv.Itoa(partitions))
	if !strings.Contains(out, "3 brokers: replication factor 3, min.insync.replicas 2") || !strings.Contains(out, fmt.Sprintf("all %d topics match", len(s.topicNames()))) {
		t.Fatalf("meterline topics create on the cluster:\n%s", out)
	}
	entWritten := s.writeEntitlements()
	s.command("migrate", "--clickhouse", chAddr, "--database", db)

	now := time.Now().UnixMilli()
	today := now - now%dayMs
	s.periodP = today - dayMs
	s.cutoff = now + cutoffIn.Milliseconds()
	s.grace = time.Duration(s.cutoff-today) * time.Millisecond
	s.note("period P = %s, cutoff (end + grace %s) = %s", time.UnixMilli(s.periodP).UTC().Format(time.DateOnly), s.grace,
		time.UnixMilli(s.cutoff).UTC().Format(time.TimeOnly))
	entWritten()
	return s
}

// note logs a line of the test and writes it, with the time, to the
// journal (test.log in the logs directory).
func (s *suite) note(format string, args ...any) {
	s.t.Helper()
	msg := fmt.Sprintf(format, args...)
	s.t.Log(msg)
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if s.journal != nil {
		_, _ = fmt.Fprintf(s.journal, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), msg)
	}
}

// fatalf fails the test with a broken invariant, written to the journal
// first.
func (s *suite) fatalf(format string, args ...any) {
	s.t.Helper()
	msg := fmt.Sprintf(format, args...)
	s.journalMu.Lock()
	if s.journal != nil {
		_, _ = fmt.Fprintf(s.journal, "%s FAIL: %s\n", time.Now().UTC().Format("15:04:05.000"), msg)
	}
	s.journalMu.Unlock()
	s.t.Fatal(msg)
}

// command runs a meterline command to completion and returns its output.
func (s *suite) command(args ...string) string {
	s.t.Helper()
	code, out := meterline(s.t, s.bin, args...)
	if code != 0 {
		s.t.Fatalf("meterline %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// meterline runs the binary with args in the test's environment without
// the METERLINE_* variables and returns its exit code and output.
func meterline(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "METERLINE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("meterline %s: %v\n%s", strings.Join(args, " "), err, out)
	return 0, ""
}

// topicsCheck runs `meterline topics check` on the suite's topics.
func (s *suite) topicsCheck() (int, string) {
	s.t.Helper()
	return meterline(s.t, s.bin, "topics", "check", "--brokers", strings.Join(s.brokers, ","), "--topic-prefix", s.names.Prefix,
		"--partitions", strconv.Itoa(partitions))
}

func (s *suite) group(stage string) string { return s.names.Prefix + stage }

// txnID is the transactional ID of a stage instance (docs/design.md,
// Exactly-once, "One Kafka session").
func (s *suite) txnID(stage, id string) string { return s.group(stage) + "-" + id }

// ---- stage instances ----

// start runs instance id of the stage; its state stays in s.dir across
// restarts. It may die (the test kills it); an exit the test did not cause
// fails the test at the next check.
func (s *suite) start(stage, id string) *testenv.Process {
	s.t.Helper()
	key := stage + "/" + id
	s.mu.Lock()
	if p := s.live[key]; p != nil && !p.Exited() {
		s.mu.Unlock()
		s.fatalf("%s is already running", key)
	}
	s.starts[key]++
	run := s.starts[key]
	s.mu.Unlock()
	args := []string{stage,
		"--brokers", strings.Join(s.brokers, ","),
		"--topic-prefix", s.names.Prefix,
		"--group", s.group(stage),
		"--instance-id", id,
		"--metrics-addr", "127.0.0.1:0",
		"--session-timeout", sessionTimeout.String(),
		"--transaction-timeout", transactionTimeout.String(),
		"--rebalance-timeout", rebalanceTimeout.String(),
		"--log-level", "info",
	}
	switch stage {
	case "dedup":
		args = append(args, "--state-dir", filepath.Join(s.dir, "state"), "--commit-interval", commitInterval.String(),
			"--tick-interval", tickInterval.String(), "--dedup-keys-file", s.keys)
	case "aggregate":
		args = append(args, "--state-dir", filepath.Join(s.dir, "state"), "--commit-interval", commitInterval.String(),
			"--period", "day", "--grace", s.grace.String(), "--entitlements")
	case "sink":
		args = append(args, "--clickhouse", s.chAddr, "--database", s.db, "--max-batch-wait", "200ms", "--commit-interval", "200ms",
			"--insert-timeout", "10s")
	}
	// Per-record decision lines are many and say little.
	skip := `"msg":"duplicate dropped"`
	if stage == "aggregate" {
		skip = `"msg":"late event booked as an adjustment"`
	}
	s.note("start %s#%d", key, run)
	p := testenv.StartProcessOpts(s.t, testenv.ProcessOpts{MayDie: true, ExitTimeout: exitTimeout, TailSkip: skip},
		fmt.Sprintf("%s#%d", key, run), filepath.Join(s.logs, fmt.Sprintf("%s-%s-%d.log", stage, id, run)), s.bin, args...)
	s.mu.Lock()
	s.live[key] = p
	s.mu.Unlock()
	return p
}

// startAll starts instances i1 and i2 of every stage.
func (s *suite) startAll() {
	for _, st := range stages {
		for _, id := range []string{"i1", "i2"} {
			s.start(st, id)
		}
	}
}

// proc returns the current process of stage/id (nil if never started).
func (s *suite) proc(stage, id string) *testenv.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[stage+"/"+id]
}

// running returns the IDs of the stage's instances that run, sorted.
func (s *suite) running(stage string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for key, p := range s.live {
		if st, id, _ := strings.Cut(key, "/"); st == stage && !p.Exited() {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// kill SIGKILLs stage/id (restarted first if it had exited by itself).
func (s *suite) kill(stage, id string) {
	s.t.Helper()
	s.checkAlive()
	p := s.proc(stage, id)
	s.mu.Lock()
	s.killed[p] = true
	s.mu.Unlock()
	s.note("kill -9 %s", p.Name())
	p.Kill(s.t)
}

// stop stops stage/id with SIGTERM, as an operator would; it must exit 0.
func (s *suite) stop(stage, id string) {
	s.t.Helper()
	s.checkAlive()
	p := s.proc(stage, id)
	s.mu.Lock()
	s.killed[p] = true
	s.mu.Unlock()
	s.note("SIGTERM %s", p.Name())
	p.Stop(s.t)
}

// checkAlive restarts every instance that exited without the test killing
// or stopping it, as a supervisor (systemd, Kubernetes) would, and records
// the exit: a stage must ride out the loss of any one broker, so finish
// fails the test for each one, after the reconciliation has shown whether
// exactly-once held regardless.
func (s *suite) checkAlive() {
	s.t.Helper()
	s.mu.Lock()
	var dead []string
	var fatal string
	for key, p := range s.live {
		if p.Exited() && !s.killed[p] {
			s.killed[p] = true
			s.selfExits = append(s.selfExits, fmt.Sprintf("%s exited by itself (%s): %s; its last log lines:\n    %s", p.Name(), p.ExitString(), lastError(p),
				strings.ReplaceAll(p.Tail(8), "\n", "\n    ")))
			dead = append(dead, key)
			s.exitsOf[key]++
			if strings.Contains(p.ExitString(), "exit status 2") || s.exitsOf[key] > 5 {
				fatal = fmt.Sprintf("%s exited by itself %d times, last (%s):\n%s", key, s.exitsOf[key], p.ExitString(), p.Tail(20))
			}
		}
	}
	s.mu.Unlock()
	if fatal != "" {
		s.fatalf("%s", fatal) // a configuration error or a crash loop: restarting cannot help
	}
	sort.Strings(dead)
	for _, key := range dead {
		st, id, _ := strings.Cut(key, "/")
		s.note("%s exited by itself; restarting it", key)
		s.start(st, id)
	}
}

// lastError returns the last error line of the process's log.
func lastError(p *testenv.Process) string {
	lines := p.LogLines()
	for i := len(lines) - 1; i >= 0; i-- {
		if lvl, _ := lines[i].Fields["level"].(string); lvl == "error" || lvl == "fatal" {
			if e, ok := lines[i].Fields["error"].(string); ok {
				return lines[i].Msg + ": " + e
			}
			return lines[i].Msg
		}
	}
	return p.Tail(1)
}

// sleep waits d, restarting instances that exit meanwhile (checkAlive).
func (s *suite) sleep(d time.Duration) {
	s.t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		s.checkAlive()
		time.Sleep(min(500*time.Millisecond, time.Until(end)))
	}
}

// checkNoSelfExits fails the test for every instance that exited by
// itself.
func (s *suite) checkNoSelfExits() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.selfExits) > 0 {
		msg := fmt.Sprintf("%d stage instances exited by themselves (each was restarted, as a supervisor would):\n  %s",
			len(s.selfExits), strings.Join(s.selfExits, "\n  "))
		s.journalMu.Lock()
		if s.journal != nil {
			_, _ = fmt.Fprintf(s.journal, "%s FAIL: %s\n", time.Now().UTC().Format("15:04:05.000"), msg)
		}
		s.journalMu.Unlock()
		s.t.Error(msg)
	}
}

// ---- the generator ----

type kind int

const (
	kindEvent     kind = iota // an event of today, on time
	kindMisrouted             // an event of today in a partition that is not murmur2(key) mod N
	kindPeriodP               // an event of yesterday (P): on time before the cutoff, late after it
	kindOld                   // an event of three days ago: late
	kindCopy                  // another copy of an acknowledged event, exact or conflicting
	kindBad                   // a record dedup must reject
)

// intent is one record the generator sent, as it meant it.
type intent struct {
	kind     kind
	identity string // canonical key
	eventID  string
	cust     string
	meter    string
	qty      int64
	et       int64 // ms
	conflict bool  // a copy with another quantity
	reason   string
}

// seqHeader carries the generator's sequence number of a record, so that
// the truth can be read back from usage.events with the broker's stamp.
const seqHeader = "clustertest-seq"

// generator produces usage at a fixed rate into usage.events with an
// idempotent acks=all producer (the producer library's options), and
// remembers every record it sent.
type generator struct {
	s    *suite
	cl   *kgo.Client
	p    *producer.Producer
	rate int
	rng  *rand.Rand

	mu        sync.Mutex
	intents   []intent
	acked     []bool
	failed    int
	firstErr  error
	originals []int // acknowledged events that copies may repeat

	stopc chan struct{}
	done  chan struct{}
}

var (
	customers = []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"}
	meters    = []string{"api_calls", "tokens"}
)

// generate starts the generator at rate records a second.
func (s *suite) generate(rate int) *generator {
	s.t.Helper()
	cl, err := kgo.NewClient(producer.ClientOptions(producer.WithBrokers(s.brokers...),
		producer.WithClientOptions(kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(s.names.EventsTopic())))...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(cl.Close)
	p, err := producer.New(producer.WithClient(cl), producer.WithTopic(s.names.EventsTopic()), producer.WithSource("clustertest"))
	if err != nil {
		s.t.Fatal(err)
	}
	g := &generator{s: s, cl: cl, p: p, rate: rate, rng: rand.New(rand.NewSource(time.Now().UnixNano())),
		stopc: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g
}

func (g *generator) run() {
	defer close(g.done)
	tk := time.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	carry := 0.0
	for {
		select {
		case <-g.stopc:
			return
		case <-tk.C:
		}
		carry += float64(g.rate) / 100
		for ; carry >= 1; carry-- {
			g.one()
		}
	}
}

// stop stops the generator and waits until every record is acknowledged
// or failed.
func (g *generator) stop() {
	g.s.t.Helper()
	close(g.stopc)
	<-g.done
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := g.cl.Flush(ctx); err != nil {
		g.s.t.Fatalf("generator flush: %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	acked := 0
	for _, a := range g.acked {
		if a {
			acked++
		}
	}
	g.s.note("generator: %d records sent, %d acknowledged, %d failed (first: %v)", len(g.intents), acked, g.failed, g.firstErr)
}

func (g *generator) one() {
	now := time.Now().UnixMilli()
	r := g.rng.Intn(100)
	g.mu.Lock()
	canCopy := len(g.originals) > 0
	g.mu.Unlock()
	switch {
	case r < 7 && canCopy:
		g.copy()
		return
	case r < 10:
		g.bad(now)
		return
	}
	in := intent{kind: kindEvent, cust: customers[g.rng.Intn(len(customers))], meter: meters[g.rng.Intn(len(meters))],
		qty: int64(1 + g.rng.Intn(1000)), et: now - g.rng.Int63n(20_000)}
	switch {
	case r < 15:
		in.kind = kindMisrouted
	case r < 30:
		in.kind, in.et = kindPeriodP, g.s.periodP+g.rng.Int63n(dayMs)
	case r < 33:
		in.kind, in.et = kindOld, g.s.periodP-2*dayMs+g.rng.Int63n(dayMs)
	}
	// The limited customers' events (entitlements_test.go): one quantity
	// per capped meter; the credit customer's of one meter, today, with
	// an event time the rate card prices.
	if l, ok := capped[in.cust][in.meter]; ok {
		in.qty = l.qty
	}
	if in.cust == creditCustomer {
		in.meter, in.qty, in.et = creditMeter, creditQty, max(now, g.s.entWritten)
		if in.kind != kindMisrouted {
			in.kind = kindEvent
		}
	}
	g.sendEvent(in, fmt.Sprintf("ev-%d-%d", now, g.rng.Int63()))
}

// sendEvent sends in as an event with the given event ID, to its
// canonical partition unless it is misrouted.
func (g *generator) sendEvent(in intent, eventID string) {
	rec, err := g.p.Record(producer.Event{EventID: eventID, CustomerID: in.cust, Meter: in.meter, Quantity: in.qty,
		EventTime: time.UnixMilli(in.et), Source: "clustertest"})
	if err != nil {
		g.fail(err)
		return
	}
	in.identity, in.eventID = string(rec.Key), eventID
	rec.Partition = schemas.Partition(rec.Key, partitions)
	if in.kind == kindMisrouted {
		rec.Partition = (rec.Partition + 1 + g.rng.Int31n(partitions-1)) % partitions
	}
	g.send(in, rec)
}

// copy re-sends an acknowledged event, as a retrying service would; a
// third of the copies carry another quantity (a conflict).
func (g *generator) copy() {
	g.mu.Lock()
	orig := g.intents[g.originals[g.rng.Intn(len(g.originals))]]
	g.mu.Unlock()
	in := orig
	in.kind = kindCopy
	if g.rng.Intn(3) == 0 {
		in.conflict = true
		in.qty++
	}
	rec, err := g.p.Record(producer.Event{EventID: orig.eventID, CustomerID: in.cust, Meter: in.meter, Quantity: in.qty,
		EventTime: time.UnixMilli(in.et), Source: "clustertest"})
	if err != nil {
		g.fail(err)
		return
	}
	rec.Partition = schemas.Partition(rec.Key, partitions)
	g.send(in, rec)
}

// bad sends a record dedup must reject, built by hand as a buggy client
// would.
func (g *generator) bad(now int64) {
	id := fmt.Sprintf("bad-%d-%d", now, g.rng.Int63())
	ue := &schemas.UsageEvent{EventID: id, CustomerID: customers[g.rng.Intn(len(customers))], Meter: "api_calls", Quantity: 1,
		EventTime: now, Source: "clustertest"}
	in := intent{kind: kindBad}
	var value []byte
	switch g.rng.Intn(4) {
	case 0:
		in.reason, ue.Quantity = schemas.ReasonInvalid, -5
	case 1:
		in.reason, ue.EventTime = schemas.ReasonTooOld, now-40*dayMs
	case 2:
		in.reason, ue.EventTime = schemas.ReasonInFuture, now+3*time.Hour.Milliseconds()
	default:
		in.reason, value = schemas.ReasonUndecodable, []byte(`{"event_id":"`+id+`","quantity":1}`)
	}
	if value == nil {
		var err error
		if value, err = schemas.Encode(ue); err != nil {
			g.fail(err)
			return
		}
	}
	key := ue.Identity().Key()
	in.identity = string(key)
	g.send(in, &kgo.Record{Key: key, Value: value, Partition: schemas.Partition(key, partitions)})
}

func (g *generator) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failed++
	if g.firstErr == nil {
		g.firstErr = err
	}
}

func (g *generator) send(in intent, rec *kgo.Record) {
	g.mu.Lock()
	seq := len(g.intents)
	g.intents = append(g.intents, in)
	g.acked = append(g.acked, false)
	g.mu.Unlock()
	rec.Topic = g.s.names.EventsTopic()
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: seqHeader, Value: strconv.AppendInt(nil, int64(seq), 10)})
	g.cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			g.fail(err)
			return
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		g.acked[seq] = true
		if in.kind == kindEvent || in.kind == kindPeriodP || in.kind == kindOld {
			g.originals = append(g.originals, seq)
		}
	})
}

// ---- the truth ----

// ident is one identity as the truth knows it: its first copy.
type ident struct {
	cust, meter string
	qty, et     int64
	arrival     int64 // ms: the broker's LogAppendTime of its first copy
}

type truth struct {
	idents    map[string]*ident
	copies    int
	conflicts int
	rejected  map[string]int
	sent      int            // records in usage.events from the generator
	copiesOf  map[string]int // identity → its copies
}

// truth reads the generator's records back from usage.events, with the
// arrival time the broker stamped on each, and derives what every output
// must hold. Every acknowledged record must be there: with replication
// factor 3 and min.insync.replicas 2, no broker failure loses a write
// acknowledged with acks=all. A record whose send failed counts if the
// broker has it (its acknowledgement was lost, not its write).
func (s *suite) truth(g *generator) *truth {
	s.t.Helper()
	arrivals := map[int]int64{}
	for _, r := range s.readAll(s.names.EventsTopic()) {
		var seq = -1
		rerouted := false
		for _, h := range r.Headers {
			switch h.Key {
			case seqHeader:
				if n, err := strconv.Atoi(string(h.Value)); err == nil {
					seq = n
				}
			case dedup.HeaderRerouted:
				rerouted = true
			}
		}
		if seq < 0 || rerouted {
			continue // a tick, or dedup's re-produced copy of a misrouted record
		}
		if _, dup := arrivals[seq]; dup {
			s.fatalf("generator record %d is twice in %s (partition %d, offset %d the second time): the idempotent producer wrote it twice",
				seq, s.names.EventsTopic(), r.Partition, r.Offset)
		}
		arrivals[seq] = r.Timestamp.UnixMilli()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	tr := &truth{idents: map[string]*ident{}, rejected: map[string]int{}, copiesOf: map[string]int{}}
	lost := 0
	lostBy := map[int32]int{} // by canonical partition (a misrouted record was sent elsewhere)
	for seq, in := range g.intents {
		at, ok := arrivals[seq]
		if !ok {
			if g.acked[seq] {
				lost++
				lostBy[schemas.Partition([]byte(in.identity), partitions)]++
			}
			continue
		}
		tr.sent++
		switch in.kind {
		case kindBad:
			tr.rejected[in.reason]++
		case kindCopy:
			tr.copies++
			tr.copiesOf[in.identity]++
			if in.conflict {
				tr.conflicts++
			}
		default:
			tr.idents[in.identity] = &ident{cust: in.cust, meter: in.meter, qty: in.qty, et: in.et, arrival: at}
		}
	}
	if lost > 0 {
		s.fatalf("%d acknowledged records are not in %s: an acks=all write was lost (by partition: %v)", lost, s.names.EventsTopic(), lostBy)
	}
	return tr
}

// onTime reports whether an identity counts in its period's FINAL
// (docs/design.md, Time): it arrived at or before its period's end + grace.
func (s *suite) onTime(id *ident) bool {
	start := id.et - id.et%dayMs
	return id.arrival <= start+dayMs+s.grace.Milliseconds()
}

// ---- waiting ----

// readAll reads every committed data record of the topic up to the high
// watermarks read now.
func (s *suite) readAll(topic string) []*kgo.Record {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	recs, err := topics.ReadCommitted(ctx, s.brokers, topic, nil)
	if err != nil {
		s.fatalf("reading %s: %v", topic, err)
	}
	return recs
}

// caughtUp reports whether a read_committed read of the topic from the
// group's committed offsets returns no records (docs/operations.md, Lag),
// other than those skip accepts (ticks, which running dedup instances
// append all the time). When it does not, pending says which partitions
// hold records past their committed offset: each with its committed offset,
// how many records follow it and the first one's offset and kind.
func (s *suite) caughtUp(group, topic string, skip func(schemas.Kind) bool) (ok bool, pending string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		return false, "", err
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		return false, "", err
	}
	from := map[int32]int64{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			from[o.Partition] = o.At
		}
	})
	if len(from) < partitions {
		// A partition without a committed offset is read from its start
		// (the stages reset to the earliest offset): caught up if it is
		// empty (usage.balances: no customer of the partition has a
		// balance), else its records are pending.
		for p := range int32(partitions) {
			if _, ok := from[p]; !ok {
				from[p] = 0
			}
		}
	}
	recs, err := topics.ReadCommitted(ctx, s.brokers, topic, from)
	if err != nil {
		return false, "", err
	}
	type behind struct {
		n     int
		first *kgo.Record
		kind  string
	}
	by := map[int32]*behind{}
	for _, r := range recs {
		k, kerr := schemas.PeekKind(r.Value)
		if kerr == nil && skip != nil && skip(k) {
			continue
		}
		b := by[r.Partition]
		if b == nil {
			b = &behind{first: r, kind: fmt.Sprint(k)}
			if kerr != nil {
				b.kind = "undecodable: " + kerr.Error()
			}
			by[r.Partition] = b
		}
		b.n++
	}
	if len(by) == 0 {
		return true, "", nil
	}
	var lines []string
	for _, p := range slices.Sorted(maps.Keys(by)) {
		b := by[p]
		lines = append(lines, fmt.Sprintf("partition %d: committed offset %d, %d records past it (the first at offset %d, a %s)",
			p, from[p], b.n, b.first.Offset, b.kind))
	}
	return false, strings.Join(lines, "; "), nil
}

// waitCaughtUp waits until the group has caught up on every topic, failing
// the test after caughtUpTimeout (a stuck partition: the failure names the
// partitions with records past their committed offsets) or when an
// instance exits by itself.
func (s *suite) waitCaughtUp(group string, skip func(schemas.Kind) bool, topicNames ...string) {
	s.t.Helper()
	start := time.Now()
	for _, topic := range topicNames {
		var last error
		var pending string
		for {
			s.checkAlive()
			ok, p, err := s.caughtUp(group, topic, skip)
			if err == nil && ok {
				break
			}
			if err == nil {
				pending = p
			}
			last = err
			if time.Since(start) > caughtUpTimeout {
				s.fatalf("no stuck partition: group %s not caught up on %s after %s: %s (last error: %v)", group, topic, caughtUpTimeout, pending, last)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	s.note("%s caught up on %s after %s", group, strings.Join(topicNames, ", "), time.Since(start).Round(time.Millisecond))
}

// waitFinalsOut waits until the aggregator has emitted everything due by
// P's cutoff. Its input offsets do not say so: a period decided final
// sends its FINAL revisions, and the adjustments queued behind them, in
// chunks of their own transactions after the input that decided it
// (docs/design.md, Exactly-once, 7), so an aggregator caught up on
// usage.deduped may still have some to send. The running instances' metrics
// do: between them every partition has a watermark past the cutoff (it is
// owned and has seen the ticks that decide P), none has a final-due time
// at or before the cutoff, and none has a customer's balance pending
// (docs/entitlements.md, The aggregator, 4).
func (s *suite) waitFinalsOut() {
	s.t.Helper()
	start := time.Now()
	cutoff := float64(s.cutoff) / 1000
	clock := func(secs float64) string { return time.UnixMilli(int64(secs * 1000)).UTC().Format("15:04:05.000") }
	var state string
	for {
		s.checkAlive()
		// Per partition: the most advanced watermark any running instance
		// reports (an instance that lost the partition may still show an
		// older one) and who reports it.
		wm := map[string]float64{}
		owner := map[string]string{}
		var due []string
		ok := true
		for _, id := range s.running("aggregate") {
			m, err := s.proc("aggregate", id).Metrics()
			if err != nil {
				state = fmt.Sprintf("aggregate %s: %v", id, err)
				ok = false
				break
			}
			for series, v := range m {
				if p, found := strings.CutPrefix(series, `meterline_aggregate_watermark_seconds{partition="`); found {
					p = strings.TrimSuffix(p, `"}`)
					if cur, seen := wm[p]; !seen || v > cur {
						wm[p], owner[p] = v, id
					}
				}
				if p, found := strings.CutPrefix(series, `meterline_aggregate_final_due_seconds{partition="`); found && v <= cutoff {
					due = append(due, fmt.Sprintf("partition %s due %s (aggregate %s)", strings.TrimSuffix(p, `"}`), clock(v), id))
				}
				if p, found := strings.CutPrefix(series, `meterline_aggregate_balances_pending{partition="`); found && v > 0 {
					due = append(due, fmt.Sprintf("partition %s: %.0f balances pending (aggregate %s)", strings.TrimSuffix(p, `"}`), v, id))
				}
			}
		}
		if ok {
			sort.Strings(due)
			var behind []string
			past := 0
			for p := range int32(partitions) {
				key := fmt.Sprint(p)
				v, seen := wm[key]
				switch {
				case !seen:
					behind = append(behind, fmt.Sprintf("partition %d: no running instance reports a watermark (unowned or not restored)", p))
				case v <= cutoff:
					behind = append(behind, fmt.Sprintf("partition %d: watermark %s (aggregate %s)", p, clock(v), owner[key]))
				default:
					past++
				}
			}
			state = fmt.Sprintf("%d of %d partitions past the cutoff %s; behind it: %v; still to go out: %v", past, partitions, clock(cutoff), behind, due)
			if past == partitions && len(due) == 0 {
				s.watermarks = map[int32]int64{}
				for p := range int32(partitions) {
					s.watermarks[p] = int64(math.Round(wm[fmt.Sprint(p)] * 1000))
				}
				break
			}
		}
		if time.Since(start) > caughtUpTimeout {
			s.fatalf("no stuck partition, P's FINAL out: the aggregator has not emitted everything due by P's cutoff after %s: %s", caughtUpTimeout, state)
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.note("the aggregator emitted everything due by P's cutoff after %s", time.Since(start).Round(time.Millisecond))
}

// finish stops the generator, brings every stage back to instances i1 and
// i2, lets the pipeline drain, and reconciles every output with the truth.
func (s *suite) finish(g *generator) {
	s.t.Helper()
	g.stop()
	s.checkAlive()
	for _, st := range stages {
		have := s.running(st)
		for _, id := range have {
			if id != "i1" && id != "i2" {
				s.stop(st, id)
			}
		}
		for _, id := range []string{"i1", "i2"} {
			if p := s.proc(st, id); p == nil || p.Exited() {
				s.start(st, id)
			}
		}
	}
	tr := s.truth(g)
	s.checkAlive()
	// Dedup never catches up strictly while it runs: its instances append
	// ticks. Once only ticks remain it is stopped (SIGTERM, a clean exit),
	// and the later stages catch up strictly.
	s.waitCaughtUp(s.group("dedup"), func(k schemas.Kind) bool { return k == schemas.KindTick }, s.names.EventsTopic())
	if now := time.Now().UnixMilli(); now < s.cutoff+5000 {
		s.fatalf("the load ended before P's cutoff: nothing tested P's FINAL under faults")
	}
	for _, id := range s.running("dedup") {
		s.stop("dedup", id)
	}
	s.waitCaughtUp(s.group("aggregate"), nil, s.names.DedupedTopic())
	s.waitFinalsOut()
	s.waitCaughtUp(s.group("sink"), nil, s.names.DedupedTopic(), s.names.AggregatesTopic(), s.names.AdjustmentsTopic(),
		s.names.DuplicatesTopic(), s.names.RejectedTopic(), s.names.BalancesTopic())
	s.reconcile(tr)
	s.checkNoSelfExits()
}
