// Package sink writes the pipeline's topics into ClickHouse, one table per
// topic, exactly once (docs/design.md, The ClickHouse ledger).
//
// # Delivery guarantee
//
// The sink consumes usage.deduped, usage.aggregates, usage.adjustments,
// usage.duplicates and usage.rejected read_committed in one consumer group.
// Polled records are decoded into INSERT batches (about 10,000 rows or
// 1 s), written with one INSERT per table by an inserter goroutine while
// the next batch is polled and decoded. About once a second, once every
// batch of the window is written, one Kafka transaction commits the offsets
// of everything polled (and produces the rows the sink parks; a partition
// with a refused row is committed only up to just past it, see Failures).
// Each table therefore has its own resume point: the group's committed
// offsets of its topic.
//
// Exactly once rests on one rule, applied whenever rows at or after a
// partition's committed offset may already be in its table — on
// assignment, after an INSERT whose outcome is unknown, after a refused
// block, after an aborted window: such a partition is "dirty", and before
// its rows are inserted the sink looks up which of their (partition,
// offset) pairs the table already holds, and skips those. The lookup covers
// only offsets at or after the committed offset; the tables' sort key
// starts with (kafka_partition, intDiv(kafka_offset, 65536)), so it reads
// the few 65,536-offset chunks it names and nothing else, however large the
// table. It is correct whatever the crash: between an INSERT and the offset
// commit (all rows there), during an INSERT that wrote only some of its
// parts (some rows there), or during a refused block's split. An INSERT
// that failed without an answer from the server may still run there: the
// lookup waits until the server no longer runs it (settle.go).
//
// # Failures
//
// ClickHouse unreachable (or unable to take any block: missing table,
// too many parts, memory): the sink pauses fetching, backs off, commits
// nothing, and /readyz is not ready until an INSERT succeeds again.
//
// An INSERT failing with a server error code the sink knows neither as a
// refusal of rows nor as transient is treated as unavailability too, for
// at most Config.UnknownErrorLimit; then Run stops with
// ErrUnknownServerError (see unknownSpell for why it stops rather than
// park), having committed nothing past the rows.
//
// A block refused because of its data: the sink splits it in halves, first
// half first, so that each partition's rows are tried in offset order. The
// first refused row of a partition P, at offset O, is parked in
// usage.rejected with reason "uninsertable" before any higher offset of P
// is inserted (docs/design.md, The ClickHouse ledger): the rows of P after
// O polled in this commit window are held back (never inserted), and the
// window ends early, in a Kafka transaction that produces the parked row
// and commits P's offset at O+1 — not at the last polled offset — so a
// crash never parks a row twice. After that commit the held-back rows are
// fetched again, from O+1, in the next window. Other partitions are not
// affected. (kgo's GroupTransactSession commits the offsets it tracks for
// the polled records; Client.SetOffsets moves P's tracked offset, and its
// fetch cursor, back to O+1 before End: see rewind.)
//
// A partition read again below its recorded progress (a crash between a
// window's progress row and its commit, or an operator's move of the
// group's offset back) parks a row refused there only if no committed
// park of it exists (reread.go).
//
// A table that refuses more than MaxRefusedInARow rows in a row, with no
// row accepted in between, is treated as broken: nothing more is parked
// and the sink backs off. Each retry still tries every partition of the
// batch (a refused row's partition held back behind it, as always): a row
// accepted ends the spell, and the refusals of that attempt are parked, so
// a fixed table whose first row tried again is refused for its own sake
// does not keep the sink backing off. When every partition's next row is
// refused, a fixed table looks like a broken one, and the sink keeps
// backing off (a restart starts the count again). Rows of usage.rejected
// are quarantined at once when refused, so past the cap none is tried.
//
// Records read from usage.rejected are never parked again (docs/design.md,
// The ClickHouse ledger: it would loop). One that does not decode, or that
// ClickHouse refuses, is written whole (coordinates, key, value, headers,
// reason and error) to the usage_quarantine table instead, before its
// offset is committed, with an error log line and
// meterline_sink_quarantined_total. It is written once across crashes: the
// quarantine is looked up before each write, and the resume rule of
// usage_rejected also looks in it, so a record is a row of one of the two
// tables, once.
package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/session"
)

// Fault points of the sink's crash windows (docs/design.md, Exactly-once,
// "Crash windows"), armed in the real binary with
// METERLINE_FAULT=<point>[@n].
const (
	// FaultMidInsert: one block of a multi-block INSERT sent (its parts
	// written), the next not. Needs InsertBlockRows.
	FaultMidInsert = "sink.mid-insert"
	// FaultAfterInsert: every INSERT of a commit window succeeded, the
	// offsets are not committed.
	FaultAfterInsert = "sink.after-insert"
	// FaultAfterPark: parked rows produced in the window's transaction,
	// which is not yet ended.
	FaultAfterPark = "sink.after-park"
	// FaultAfterParkCommit: a transaction that parked a refused row (and
	// moved its partition's offset just past it) committed; the rows held
	// back behind it are not yet fetched again.
	FaultAfterParkCommit = "sink.after-park-commit"
)

var (
	// errAbandon: the window cannot commit (partitions revoked, or the
	// process is stopping while ClickHouse is unavailable); its
	// transaction is aborted and its records are re-consumed.
	errAbandon = errors.New("window abandoned")
	// errTooManyRefused: a table refused more than MaxRefusedInARow rows
	// in a row; treated as the table refusing everything.
	errTooManyRefused = errors.New("too many refused rows")
)

// Writer is the sink stage of one instance.
type Writer struct {
	cfg     Config
	loop    *session.Loop // opens the Kafka sessions, rebuilds them after ErrRestart
	log     *zap.Logger
	m       *metrics
	tables  []*table
	byTopic map[string]*table
	// quarantine is usage_quarantine: records of the rejected topic that
	// cannot be rows of usage_rejected.
	quarantine *table

	connMu sync.Mutex
	conn   driver.Conn

	sess *kgo.GroupTransactSession
	hook func(hookEvent) // tests only

	// mu guards parts and fatal. parts are the assigned topic partitions,
	// written by kgo's group goroutine (assign, revoke) and read by the run
	// loop.
	mu    sync.Mutex
	parts map[tp]*pstate
	fatal error

	// insertMu is held by every ClickHouse write attempt. A revoke takes it
	// after setting revoked, so it returns only once no write for the
	// revoked partitions can still be in flight.
	insertMu sync.Mutex
	revoked  atomic.Bool
	// unsettled: INSERT attempts with an unknown outcome that may still
	// run on the server (settle.go).
	unsettled unsettled

	// checkSince is when the oldest assigned partition not checked yet
	// against the recorded progress was assigned (zero: none), and
	// checkErr why the last attempt of that check failed ("" when none):
	// Ready reports both (guarded by mu).
	checkSince time.Time
	checkErr   string

	running atomic.Bool
	joined  atomic.Bool
	up      atomic.Bool
	lastUp  atomic.Value // string: why ClickHouse is down
	// loginRefused: the refusal of the login since ClickHouse last
	// answered is logged.
	loginRefused atomic.Bool
	// zoneUnchecked: ClickHouse went away since its time zone was last
	// checked (setUp); the next write checks it again (checkZoneAgain).
	zoneUnchecked atomic.Bool
	// wakeIdle ends the poll of a sink with no record in hand (idleCtx),
	// for the health check's refusal of the login; nil between polls.
	wakeMu   sync.Mutex
	wakeIdle context.CancelFunc
	blocked  atomic.Value // string: why the sink is backing off; "" when not
	paused   atomic.Bool  // fetching paused by the inserter

	// unknownSince is when the current spell of INSERTs failing with a
	// server error code the sink does not know began; zero when none.
	// Read and written by the inserter goroutine only; it outlives a
	// session, so a rebalance does not reset the bound.
	unknownSince time.Time
}

type tp struct {
	topic string
	p     int32
}

// pstate is one assigned partition's resume state.
type pstate struct {
	// committed is the next offset to consume per the group's committed
	// offset; -1 when the group has none (the partition is read from its
	// start) until the first row is looked up.
	committed int64
	// dirty: rows at offsets ≥ committed may already be in the table.
	dirty bool
	// maxKnown: presentMax holds the highest offset ≥ committed in the
	// table (-1: none). Cleared whenever more rows may have landed.
	maxKnown   bool
	presentMax int64
	// checked: committed was compared with the progress recorded in
	// ClickHouse (progress.go); no record of the partition is used before.
	checked bool
	// reread: set when the check finds the partition read again below its
	// recorded progress (reread.go).
	reread rereadState
	// fromCommitted: the group has a committed offset for the partition
	// (at assignment, or since a window of it committed); its progress
	// rows record it (progress.go).
	fromCommitted bool
}

// New prepares a Writer; Run starts it.
func New(cfg Config) (*Writer, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With(zap.String("stage", "sink"), zap.String("instance", cfg.InstanceID))
	m := newMetrics(cfg.Registerer)
	loop, err := session.NewLoop(cfg.Config, log, m.session, "then every partition is checked against its table again")
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	w := &Writer{
		cfg:        cfg,
		loop:       loop,
		log:        log,
		m:          m,
		tables:     newTables(cfg.Topics),
		quarantine: newQuarantine(cfg.Topics),
		byTopic:    map[string]*table{},
		parts:      map[tp]*pstate{},
		conn:       cfg.Conn,
		hook:       cfg.testHook,
	}
	for _, t := range w.tables {
		w.byTopic[t.topic] = t
		t.recordsIn = w.m.session.RecordsIn.WithLabelValues(t.topic)
		t.timeIn = w.m.timeIn.WithLabelValues(t.topic)
	}
	w.m.initSeries(w.tables, w.quarantine)
	w.blocked.Store("")
	w.lastUp.Store("not connected yet")
	return w, nil
}

// Ready returns nil when the sink is a member of its consumer group
// (session.Loop.InGroup: not while Kafka is unreachable), ClickHouse
// answers, no table is backing off and every assigned partition has been
// checked against the recorded progress (checking); otherwise why not. It
// backs /readyz.
func (w *Writer) Ready() error {
	w.mu.Lock()
	fatal := w.fatal
	w.mu.Unlock()
	if fatal != nil {
		return fatal
	}
	if !w.up.Load() {
		return fmt.Errorf("clickhouse %s: %s", w.cfg.ClickHouse, w.lastUp.Load().(string))
	}
	if b := w.blocked.Load().(string); b != "" {
		return errors.New(b)
	}
	if !w.joined.Load() {
		return errors.New("not in the consumer group")
	}
	// The rule of dedup and the aggregator (stream.Runtime.Ready).
	if err := w.loop.InGroup(); err != nil {
		return err
	}
	return w.checking()
}

// checking returns why the sink is not ready while newly assigned
// partitions are not checked against the progress recorded in
// ClickHouse (checkAssigned): none of their rows is inserted before. It
// stays so across the check's retries, saying why the last attempt failed
// and since when the partitions wait, so that a slow or failing
// ClickHouse shows as one spell of not ready with its reason, not as
// readiness that comes and goes.
func (w *Writer) checking() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, ps := range w.parts {
		if !ps.checked {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	msg := fmt.Sprintf("checking %d newly assigned partitions against the progress recorded in ClickHouse before inserting their rows (for %s)",
		n, time.Since(w.checkSince).Round(time.Millisecond))
	if w.checkErr != "" {
		msg += "; the last attempt failed, retrying: " + w.checkErr
	}
	return errors.New(msg)
}

func (w *Writer) getConn() driver.Conn {
	w.connMu.Lock()
	defer w.connMu.Unlock()
	return w.conn
}

// Run runs the sink until ctx ends (then it writes and commits the window
// in hand, if ClickHouse takes it, leaves the group and returns nil) or a
// fatal error occurs. It is called once.
func (w *Writer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("sink: Run called twice")
	}
	if err := w.connect(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if w.cfg.Conn == nil {
		defer func() { _ = w.getConn().Close() }()
	}
	pctx, stopPing := context.WithCancel(ctx)
	pingDone := make(chan struct{})
	go func() { defer close(pingDone); w.pingLoop(pctx) }()
	defer func() { stopPing(); <-pingDone }()

	err := w.loop.Run(ctx, func(ctx context.Context) error {
		err := w.runSession(ctx)
		if errors.Is(err, errAbandon) && ctx.Err() != nil {
			return nil // stopping: the window's records are re-consumed on restart
		}
		return err
	})
	if err != nil {
		w.setFatal(err)
	}
	return err
}

func (w *Writer) setFatal(err error) {
	w.mu.Lock()
	if w.fatal == nil {
		w.fatal = err
	}
	w.mu.Unlock()
}

func (w *Writer) topicNames() []string {
	out := make([]string, len(w.tables))
	for i, t := range w.tables {
		out[i] = t.topic
	}
	return out
}

// hookEvent is what a test hook sees (Config.testHook).
type hookEvent struct {
	kind  string
	table string
	topic string
	// insert: per partition, the lowest and highest offset inserted.
	spans map[int32][2]int64
	// commit: the refused rows the committed transaction parked.
	parked []parkedAt
}

const (
	hookInsert = "insert" // an INSERT succeeded
	hookCommit = "commit" // a transaction committed
)

type parkedAt struct {
	topic     string
	partition int32
	offset    int64
}
