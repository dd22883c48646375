// Package sink writes the pipeline's topics into ClickHouse, one table per
// topic, exactly once (DESIGN §7).
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
// parts (some rows there), or during a refused block's split.
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
// is inserted (DESIGN §7): the rows of P after O polled in this commit
// window are held back (never inserted), and the window ends early, in a
// Kafka transaction that produces the parked row and commits P's offset
// at O+1 — not at the last polled offset — so a crash never parks a row
// twice. After that commit the held-back rows are fetched again, from
// O+1, in the next window. Other partitions are not affected. (kgo's
// GroupTransactSession commits the offsets it tracks for the polled
// records; Client.SetOffsets moves P's tracked offset, and its fetch
// cursor, back to O+1 before End: see rewind.)
//
// A table that refuses more than MaxRefusedInARow rows in a row, with no
// row accepted in between, is treated as broken: nothing more is parked
// and the sink backs off.
//
// Records read from usage.rejected are never parked again (DESIGN §7: it
// would loop). One that does not decode, or that ClickHouse refuses, is
// written whole (coordinates, key, value, headers, reason and error) to
// the usage_quarantine table instead, before its offset is committed, with
// an error log line and meterline_sink_quarantined_total. It is written
// once across crashes: the quarantine is looked up before each write, and
// the resume rule of usage_rejected also looks in it, so a record is a row
// of one of the two tables, once.
package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/schemas"
)

// Fault points of the sink's crash windows (DESIGN §6), armed in the real
// binary with METERLINE_FAULT=<point>[@n].
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
	// errRestart asks Run to rebuild the Kafka session (commit outcome
	// unknown).
	errRestart = errors.New("restart session")
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
	kafka   []kgo.Opt // cfg.Kafka's seed brokers, SASL and TLS
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

	running atomic.Bool
	joined  atomic.Bool
	up      atomic.Bool
	lastUp  atomic.Value // string: why ClickHouse is down
	blocked atomic.Value // string: why the sink is backing off; "" when not
	paused  atomic.Bool  // fetching paused by the inserter

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
}

// New prepares a Writer; Run starts it.
func New(cfg Config) (*Writer, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kafkaOpts, err := cfg.Kafka.Opts()
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	w := &Writer{
		cfg:        cfg,
		kafka:      kafkaOpts,
		log:        cfg.Logger.With(zap.String("stage", "sink"), zap.String("instance", cfg.InstanceID)),
		m:          newMetrics(cfg.Registerer),
		tables:     newTables(cfg.Topics),
		quarantine: newQuarantine(cfg.Topics),
		byTopic:    map[string]*table{},
		parts:      map[tp]*pstate{},
		conn:       cfg.Conn,
		hook:       cfg.testHook,
	}
	for _, t := range w.tables {
		w.byTopic[t.topic] = t
		t.recordsIn = w.m.recordsIn.WithLabelValues(t.topic)
	}
	w.blocked.Store("")
	w.lastUp.Store("not connected yet")
	return w, nil
}

// Ready returns nil when the sink is in its consumer group, ClickHouse
// answers and no table is backing off; otherwise why not. It backs /readyz.
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
	return nil
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

	for {
		err := w.runSession(ctx)
		if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled) || errors.Is(err, errRestart) || errors.Is(err, errAbandon)) {
			return nil
		}
		if !errors.Is(err, errRestart) {
			w.setFatal(err)
			return err
		}
		w.m.restarts.Inc()
		w.log.Warn("commit outcome unknown: rebuilding the Kafka session with the same transactional ID (which aborts or completes the open transaction); every partition is re-checked against its table",
			zap.String("transactional_id", w.cfg.TransactionalID()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.cfg.RestartBackoff):
		}
	}
}

// connect dials ClickHouse (retrying while it is unreachable) and checks
// that the migrations are applied and that no rebuild of the derived
// tables is unfinished.
func (w *Writer) connect(ctx context.Context) error {
	conn := w.cfg.Conn
	for attempt := 0; conn == nil; attempt++ {
		c, err := w.cfg.ClickHouseServer.Dial(ctx, w.cfg.Database, false)
		if err == nil {
			conn = c
			break
		}
		if ex := (*proto.Exception)(nil); errors.As(err, &ex) && ex.Code == 81 { // UNKNOWN_DATABASE
			return fmt.Errorf("%w (run `meterline migrate --database %s`)", err, w.cfg.Database)
		}
		w.lastUp.Store(err.Error())
		if attempt == 0 {
			w.log.Warn("clickhouse not reachable; retrying", zap.String("addr", w.cfg.ClickHouse), zap.Error(err))
		}
		if err := sleep(ctx, w.backoff(attempt)); err != nil {
			return err
		}
	}
	w.connMu.Lock()
	w.conn = conn
	w.connMu.Unlock()
	for attempt := 0; ; attempt++ {
		err := CheckMigrations(ctx, conn)
		if err == nil {
			break
		}
		if errors.Is(err, ErrMigrationsPending) || errors.Is(err, ErrMigrationChanged) {
			return err
		}
		w.log.Warn("checking migrations failed; retrying", zap.Error(err))
		if err := sleep(ctx, w.backoff(attempt)); err != nil {
			return err
		}
	}
	// A rebuild of the derived tables swaps whole months: rows the views
	// wrote meanwhile would be lost, so no sink starts until it finished.
	for attempt := 0; ; attempt++ {
		err := CheckRebuilds(ctx, conn)
		if err == nil {
			break
		}
		if errors.Is(err, ErrRebuildUnfinished) {
			return err
		}
		w.log.Warn("checking for unfinished rebuilds failed; retrying", zap.Error(err))
		if err := sleep(ctx, w.backoff(attempt)); err != nil {
			return err
		}
	}
	w.up.Store(true)
	w.m.up.Set(1)
	return nil
}

func (w *Writer) pingLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, w.cfg.PingInterval)
		err := w.getConn().Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.setUp(err)
	}
}

func (w *Writer) setUp(err error) {
	if err != nil {
		w.lastUp.Store(err.Error())
		if w.up.Swap(false) {
			w.log.Warn("clickhouse stopped answering", zap.String("addr", w.cfg.ClickHouse), zap.Error(err))
		}
		w.m.up.Set(0)
		return
	}
	if !w.up.Swap(true) {
		w.log.Info("clickhouse answers again", zap.String("addr", w.cfg.ClickHouse))
	}
	w.m.up.Set(1)
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

func (w *Writer) clientOptions() []kgo.Opt {
	c := &w.cfg
	opts := []kgo.Opt{
		kgo.TransactionalID(c.TransactionalID()),
		kgo.TransactionTimeout(c.TransactionTimeout),
		kgo.ConsumerGroup(c.Group),
		kgo.ConsumeTopics(w.topicNames()...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		// No automatic reset: an out-of-range offset (retention deleted
		// records the sink never wrote) is an error, never a silent jump.
		// A first start reads from the start (adjustOffsets).
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.RebalanceTimeout(c.RebalanceTimeout),
		kgo.HeartbeatInterval(c.SessionTimeout / 10),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.ProducerLinger(0),
		kgo.AdjustFetchOffsetsFn(w.adjustOffsets),
		kgo.OnPartitionsRevoked(w.onRevoked),
		kgo.OnPartitionsLost(w.onRevoked),
		kgo.WithLogger(kzap.New(w.log.Named("kgo"), kzap.Level(kgoLevel(w.log)))),
	}
	return slices.Concat(w.kafka, opts, c.ClientOptions)
}

func kgoLevel(l *zap.Logger) kgo.LogLevel {
	if l.Core().Enabled(zap.DebugLevel) {
		return kgo.LogLevelDebug
	}
	return kgo.LogLevelWarn
}

// adjustOffsets runs on kgo's group goroutine once the group's committed
// offsets of newly assigned partitions are fetched (stable: no transaction
// of a previous owner is pending). Every assigned partition starts dirty:
// a previous owner may have inserted rows past its last commit.
func (w *Writer) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	assigned := map[string][]string{}
	for topic, parts := range offsets {
		for p, o := range parts {
			committed := o.EpochOffset().Offset
			if committed < 0 {
				// A first start reads from the earliest offset. The table
				// may still hold rows (the group's offsets were lost): the
				// lookup then starts at the first row consumed (see
				// filterPresent).
				committed = -1
				parts[p] = kgo.NoResetOffset().AtStart()
			}
			w.parts[tp{topic, p}] = &pstate{committed: committed, dirty: true}
			assigned[topic] = append(assigned[topic], fmt.Sprintf("%d@%d", p, committed))
		}
	}
	w.log.Info("partitions assigned (partition@committed offset); each is checked against its table before its rows are inserted",
		zap.Any("partitions", assigned))
	w.m.owned.Set(float64(len(w.parts)))
	return offsets, nil
}

// onRevoked runs on kgo's group goroutine for revoked and lost partitions.
// The GroupTransactSession has already marked the open window as unable to
// commit. Here the run loop is told to abandon its window, and the revoke
// waits for a ClickHouse write in flight, so that the next owner's resume
// lookup sees every row this instance wrote.
func (w *Writer) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	w.revoked.Store(true)
	w.insertMu.Lock()
	//lint:ignore SA2001 an empty critical section: wait for the write in flight
	w.insertMu.Unlock()
	w.mu.Lock()
	for topic, ps := range revoked {
		for _, p := range ps {
			delete(w.parts, tp{topic, p})
		}
	}
	w.m.owned.Set(float64(len(w.parts)))
	w.mu.Unlock()
	w.log.Info("partitions revoked", zap.Any("partitions", revoked))
}

func (w *Writer) clearParts() {
	w.mu.Lock()
	w.parts = map[tp]*pstate{}
	w.m.owned.Set(0)
	w.mu.Unlock()
}

// window is the records polled since the last commit: one transaction.
type window struct {
	records int
	start   time.Time
	last    map[tp]int64   // highest polled offset per partition
	offs    map[tp][]int64 // polled offsets per partition
	parks   []decodePark   // records that did not decode, parked
}

// decodePark is a polled record that did not decode, and its Rejected
// record.
type decodePark struct {
	src tp
	off int64
	rec *kgo.Record
}

// stop is the first row of a partition that ClickHouse refused in a
// commit window: it is parked, and the partition's rows after it are held
// back until the window's transaction committed.
type stop struct {
	offset int64
	epoch  int32 // the record's leader epoch, for the rewound offset
}

// heldBack reports whether a row of partition k at offset off must not be
// inserted in this window.
func heldBack(stops map[tp]stop, k tp, off int64) bool {
	s, ok := stops[k]
	return ok && off > s.offset
}

func newWindow() *window { return &window{last: map[tp]int64{}, offs: map[tp][]int64{}} }

// heldRecords counts the window's records held back behind stops (fetched
// again after the commit).
func (win *window) heldRecords(stops map[tp]stop) int {
	n := 0
	for k, st := range stops {
		for _, off := range win.offs[k] {
			if off > st.offset {
				n++
			}
		}
	}
	return n
}

// pending is the rows of one INSERT batch (per table) being filled.
type pending struct {
	records int
	start   time.Time
	rows    map[*table][]*row
	// quarantine: records of the rejected topic that did not decode, for
	// usage_quarantine.
	quarantine []*row
}

func newPending() *pending { return &pending{rows: map[*table][]*row{}} }

func (w *Writer) runSession(ctx context.Context) error {
	sess, err := kgo.NewGroupTransactSession(w.clientOptions()...)
	if err != nil {
		return fmt.Errorf("sink: kafka client: %w", err)
	}
	w.sess = sess
	w.revoked.Store(false)
	w.joined.Store(true)
	ins := w.startInserter(ctx)
	defer func() {
		ins.close()
		w.joined.Store(false)
		w.resumeFetching()
		sess.Close()
		w.clearParts()
	}()
	w.log.Info("sink started", zap.String("group", w.cfg.Group), zap.Strings("topics", w.topicNames()),
		zap.String("transactional_id", w.cfg.TransactionalID()), zap.String("database", w.cfg.Database))

	win, cur := newWindow(), newPending()
	// closeWindow inserts what is pending, waits for every INSERT of the
	// window, and ends its transaction.
	closeWindow := func() error {
		if cur.records > 0 {
			ins.dispatch(cur)
			cur = newPending()
		}
		parks, stops, held, err := ins.wait()
		abandon := errors.Is(err, errAbandon)
		if err != nil && !abandon {
			return err
		}
		err = w.commit(ctx, win, parks, stops, held, abandon)
		win = newWindow()
		return err
	}
	for {
		if ctx.Err() != nil {
			if win.records > 0 {
				if err := closeWindow(); err != nil {
					return err
				}
			}
			return ctx.Err()
		}
		wait := w.cfg.CommitInterval
		if win.records > 0 {
			wait = time.Until(win.start.Add(w.cfg.CommitInterval))
		}
		if cur.records > 0 {
			wait = min(wait, time.Until(cur.start.Add(w.cfg.MaxBatchWait)))
		}
		fs := w.poll(ctx, wait, w.cfg.MaxBatchRecords-cur.records)
		if err := fetchError(w.log, fs); err != nil {
			return err
		}
		var derr error
		polled := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			if derr == nil {
				derr = w.add(win, cur, r, polled)
			}
		})
		if derr != nil {
			return derr
		}
		now := time.Now()
		if cur.records > 0 && (cur.records >= w.cfg.MaxBatchRecords || !now.Before(cur.start.Add(w.cfg.MaxBatchWait))) {
			// Blocks while the inserter has a batch in hand and one
			// queued: polling stops, so a slow or unavailable ClickHouse
			// holds back fetching.
			ins.dispatch(cur)
			cur = newPending()
		}
		// A refused row ends the window early: it is parked, and its
		// partition's later rows are held back until that commits.
		if win.records > 0 && (!now.Before(win.start.Add(w.cfg.CommitInterval)) || ins.stopped.Load()) {
			if err := closeWindow(); err != nil {
				return err
			}
		}
	}
}

func (w *Writer) poll(ctx context.Context, d time.Duration, max int) kgo.Fetches {
	if d <= 0 {
		d = time.Millisecond
	}
	if max < 1 {
		max = 1
	}
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return w.sess.PollRecords(pctx, max)
}

// fetchError returns the first error of the fetches that stops the sink.
// A group session error whose cause is transient (rejoining) is only
// logged: kgo injects it when the member lost the group (a missed session,
// an expired member) or could not reach the group coordinator (a broker
// that died or paused, a coordinator that moved), has already revoked the
// member's partitions through onLost (the open window can only abort, and
// the resume rule of DESIGN §7 skips its rows on reassignment), and keeps
// rejoining with backoff. Any other error, such as an authorization
// failure, stops the sink.
func fetchError(log *zap.Logger, fs kgo.Fetches) error {
	var ferr error
	fs.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		var gs *kgo.ErrGroupSession
		if errors.As(err, &gs) && kafka.GroupRejoins(gs.Err) {
			log.Warn("lost the consumer group or its coordinator; rejoining", zap.Error(err))
			return
		}
		if ferr == nil {
			ferr = fmt.Errorf("sink: fetch %s/%d: %w (offsets are never reset automatically)", t, p, err)
		}
	})
	return ferr
}

// add decodes one polled record into the window and the pending batch.
func (w *Writer) add(win *window, cur *pending, r *kgo.Record, now time.Time) error {
	t, ok := w.byTopic[r.Topic]
	if !ok {
		return nil
	}
	if win.records == 0 {
		win.start = now
	}
	if cur.records == 0 {
		cur.start = now
	}
	win.records++
	cur.records++
	k := tp{r.Topic, r.Partition}
	win.last[k] = r.Offset
	win.offs[k] = append(win.offs[k], r.Offset)
	t.recordsIn.Inc()
	row, err := t.buildRow(r)
	switch {
	case err != nil && t.rejected:
		// Never parked again (it would loop): written to usage_quarantine
		// by the inserter, before this window's offsets are committed.
		cur.quarantine = append(cur.quarantine, quarantineRow(r, decodeReason(err), fmt.Sprintf("sink: %s: %v", t.name, err)))
	case err != nil:
		reason := decodeReason(err)
		rec, perr := w.parkRecord(r, identity{}, reason, fmt.Sprintf("sink: %s: %v", t.name, err))
		if perr != nil {
			return perr
		}
		win.parks = append(win.parks, decodePark{src: tp{r.Topic, r.Partition}, off: r.Offset, rec: rec})
	case row != nil:
		cur.rows[t] = append(cur.rows[t], row)
	}
	return nil
}

func (w *Writer) parkRecord(r *kgo.Record, id identity, reason, detail string) (*kgo.Record, error) {
	rej := &schemas.Rejected{
		Reason: reason, Detail: detail, Stage: "sink",
		SourceTopic: r.Topic, SourcePartition: r.Partition, SourceOffset: r.Offset, SourceTimestamp: r.Timestamp.UnixMilli(),
		CustomerID: id.customer, Meter: id.meter, EventID: id.eventID,
		RawKey: r.Key, RawValue: r.Value,
	}
	rej.Bound() // raw bytes: a prefix, the length and a SHA-256 (DESIGN §6.10)
	v, err := schemas.Encode(rej)
	if err != nil {
		return nil, fmt.Errorf("sink: encode rejected record for %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	var key []byte
	if id.customer != "" && id.meter != "" && id.eventID != "" {
		key = schemas.Identity{CustomerID: id.customer, Meter: id.meter, EventID: id.eventID}.Key()
	}
	return &kgo.Record{Topic: w.cfg.Topics.RejectedTopic(), Key: key, Value: v}, nil
}

// parked is a row refused by ClickHouse, on its way to usage.rejected.
type parked struct {
	table *table
	row   *row
	rec   *kgo.Record // the Rejected record; nil for a row of usage.rejected
	err   string
}

// inserter writes INSERT batches on its own goroutine, in order, while the
// run loop polls and decodes the next batch. A window's transaction waits
// for every batch dispatched in the window.
type inserter struct {
	w      *Writer
	ctx    context.Context
	cancel context.CancelFunc
	jobs   chan *pending
	wg     sync.WaitGroup // dispatched batches not yet written
	done   chan struct{}
	mu     sync.Mutex
	parks  []parked
	err    error // the first error of the window; later batches are dropped
	// stops: per partition, the window's first refused (parked) row; the
	// partition's later rows are held back. Written by the inserter
	// goroutine only.
	stops   map[tp]stop
	held    int         // rows held back in the window
	stopped atomic.Bool // stops is not empty: the window should end
}

func (w *Writer) startInserter(ctx context.Context) *inserter {
	ctx, cancel := context.WithCancel(ctx)
	ins := &inserter{w: w, ctx: ctx, cancel: cancel, jobs: make(chan *pending, 1), done: make(chan struct{}), stops: map[tp]stop{}}
	go ins.run()
	return ins
}

func (ins *inserter) run() {
	defer close(ins.done)
	for p := range ins.jobs {
		for _, t := range ins.w.tables {
			rows := p.rows[t]
			ins.mu.Lock()
			failed := ins.err != nil
			ins.mu.Unlock()
			if len(rows) == 0 || failed {
				continue
			}
			ins.mu.Lock()
			stops := ins.stops
			ins.mu.Unlock()
			ft, err := ins.w.writeTable(ins.ctx, t, rows, stops)
			ins.mu.Lock()
			if ft != nil {
				ins.parks = append(ins.parks, ft.parks...)
				for k, st := range ft.stops {
					ins.stops[k] = st
				}
				ins.held += ft.held
				if len(ins.stops) > 0 {
					ins.stopped.Store(true)
				}
			}
			if err != nil && ins.err == nil {
				ins.err = err
			}
			ins.mu.Unlock()
		}
		ins.mu.Lock()
		failed := ins.err != nil
		ins.mu.Unlock()
		if len(p.quarantine) > 0 && !failed {
			if err := ins.w.writeQuarantine(ins.ctx, p.quarantine); err != nil {
				ins.mu.Lock()
				if ins.err == nil {
					ins.err = err
				}
				ins.mu.Unlock()
			}
		}
		ins.w.resumeFetching()
		ins.wg.Done()
	}
}

// dispatch hands a batch to the inserter, blocking while it is busy with
// one batch and has another queued.
//
// It never waits forever: the inserter finishes each INSERT within
// InsertTimeout, and leaves its back-off when ctx ends or the partitions
// are revoked.
func (ins *inserter) dispatch(p *pending) {
	ins.wg.Add(1)
	ins.jobs <- p
}

// wait waits until every dispatched batch is written (or dropped after an
// error) and returns the window's refused rows, the partitions held back
// behind them, and its first error.
func (ins *inserter) wait() ([]parked, map[tp]stop, int, error) {
	ins.wg.Wait()
	ins.mu.Lock()
	defer ins.mu.Unlock()
	parks, stops, held, err := ins.parks, ins.stops, ins.held, ins.err
	ins.parks, ins.stops, ins.held, ins.err = nil, map[tp]stop{}, 0, nil
	ins.stopped.Store(false)
	return parks, stops, held, err
}

// close stops the inserter: a batch in back-off is abandoned (its window
// is never committed, so its records are re-consumed).
func (ins *inserter) close() {
	ins.cancel()
	close(ins.jobs)
	<-ins.done
}

func (w *Writer) commit(ctx context.Context, win *window, parks []parked, stops map[tp]stop, held int, abandon bool) error {
	if !abandon {
		// Guarantee: every row of the window is in its table (inserted
		// now, or found there by the resume rule), or refused and about to
		// be parked, or held back behind a refused row of its partition
		// (never inserted); no offset is committed. A crash here
		// re-consumes from the committed offsets, and the resume rule
		// skips the rows already in the tables.
		fault.Hit(FaultAfterInsert)
	}
	// A record that did not decode, held back behind a stop, is fetched
	// again after this commit, and parked then: not now, or twice.
	decodeParks := win.parks
	if len(stops) > 0 {
		decodeParks = nil
		for _, d := range win.parks {
			if !heldBack(stops, d.src, d.off) {
				decodeParks = append(decodeParks, d)
			}
		}
	}
	if !abandon && len(stops) > 0 && !w.rewind(win, stops) {
		// Revoked meanwhile (the transaction could not commit anyway), or
		// kgo did not take the offsets: commit nothing, re-consume.
		abandon = true
	}
	start := time.Now()
	if err := w.sess.Begin(); err != nil {
		return fmt.Errorf("sink: begin transaction: %w", err)
	}
	var prodMu sync.Mutex
	var prodErr error
	promise := func(r *kgo.Record, err error) {
		if err != nil {
			prodMu.Lock()
			if prodErr == nil {
				prodErr = fmt.Errorf("produce to %s: %w", r.Topic, err)
			}
			prodMu.Unlock()
		}
	}
	if !abandon {
		n := 0
		for _, d := range decodeParks {
			w.sess.Produce(context.Background(), d.rec, promise)
			n++
		}
		for _, p := range parks {
			if p.rec != nil {
				w.sess.Produce(context.Background(), p.rec, promise)
				n++
			}
		}
		if n > 0 {
			// Guarantee: the parked rows are produced in the open
			// transaction, not visible; a crash aborts them with the
			// offsets, and the restart refuses and parks the rows again,
			// once.
			fault.Hit(FaultAfterPark)
		}
	}
	try := kgo.TryCommit
	if abandon {
		try = kgo.TryAbort
	}
	// End is never cancelled half-way (kgo: that leaves the client in an
	// invalid state); the deadline bounds it.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.TransactionTimeout+w.cfg.SessionTimeout)
	defer cancel()
	committed, err := w.sess.End(ectx, try)
	w.m.commitSeconds.Observe(time.Since(start).Seconds())
	w.revoked.Store(false)
	switch {
	case err != nil:
		w.m.flushes.WithLabelValues("unknown").Inc()
		w.log.Error("ending the transaction failed; outcome unknown", zap.Error(err))
		return errRestart
	case !committed:
		w.m.flushes.WithLabelValues("aborted").Inc()
		w.markDirty(win.last)
		prodMu.Lock()
		perr := prodErr
		prodMu.Unlock()
		switch {
		case perr != nil:
			w.log.Warn("transaction aborted: producing a parked row failed; re-consuming from the committed offsets", zap.Error(perr))
		case abandon && ctx.Err() != nil:
			w.log.Info("window abandoned while stopping; its records are re-consumed on restart")
			return errAbandon
		default:
			w.log.Info("transaction aborted: the group rebalanced or the commit was fenced; re-consuming from the committed offsets")
		}
		return nil
	}
	// Guarantee: the offsets of every polled record — of a stopped
	// partition, the offset just past its parked row — and the parked
	// rows are committed together.
	w.m.flushes.WithLabelValues("committed").Inc()
	heldRecs := win.heldRecords(stops)
	w.m.committed.Add(float64(win.records - heldRecs))
	w.advance(win.last, stops)
	if w.hook != nil {
		ev := hookEvent{kind: hookCommit}
		for _, p := range parks {
			if p.rec != nil {
				ev.parked = append(ev.parked, parkedAt{topic: p.table.topic, partition: p.row.partition(), offset: p.row.offset()})
			}
		}
		w.hook(ev)
	}
	for _, d := range decodeParks {
		w.m.rejected.WithLabelValues(stage, reasonOf(d.rec)).Inc()
	}
	if len(decodeParks) > 0 {
		w.log.Warn("records that do not decode parked in the rejected topic", zap.Int("records", len(decodeParks)))
	}
	if len(stops) > 0 {
		w.log.Info("window ended early at refused rows: each partition's offset committed just past its parked row; the rows held back behind it are fetched again",
			zap.Int("partitions", len(stops)), zap.Int("records_held_back", heldRecs), zap.Int("rows_held_back_before_insert", held))
	}
	parkedRows := 0
	for _, p := range parks {
		if p.rec == nil {
			continue
		}
		parkedRows++
		w.m.rows.WithLabelValues(p.table.name, outcomeParked).Inc()
		w.m.rejected.WithLabelValues(stage, schemas.ReasonUninsertable).Inc()
		w.log.Warn("row refused by clickhouse: parked in the rejected topic with reason uninsertable",
			zap.String("table", p.table.name), zap.String("record", describe(p.table, p.row.rec)),
			zap.String("customer_id", p.row.id.customer), zap.String("meter", p.row.id.meter),
			zap.String("event_id", p.row.id.eventID), zap.String("error", p.err))
	}
	if parkedRows > 0 {
		// Guarantee: the refused rows are parked and their partitions'
		// offsets committed just past them; no row after them is in the
		// table (unless an earlier owner put it there). A crash here
		// re-consumes from just past each parked row: it is not parked
		// again, and the resume rule skips what is present.
		fault.Hit(FaultAfterParkCommit)
	}
	return nil
}

// rewind moves each stopped partition's consumed offset back to just past
// its parked row, so that End commits that offset, not the last polled
// one, and the rows held back behind it are fetched again. It returns
// false when the window must not commit (revoked meanwhile, or kgo did
// not take the offsets).
//
// What it relies on in kgo (v1.22.3): GroupTransactSession.End commits
// Client.UncommittedOffsets, each polled partition's "dirty" offset.
// Client.SetOffsets sets a partition's dirty and head offsets
// (applySetOffsets) and re-seats its fetch cursor there, discarding
// buffered, unpolled fetches (assignSetMatching stops the fetch session;
// the other partitions' cursors stay just past their last polled records).
// A revoke or loss calls onRevoked before kgo forgets or reassigns a
// partition; onRevoked sets w.revoked and then waits for insertMu, held
// here, so no partition is revoked or reassigned between the check and
// SetOffsets. A revoke after it makes End abort, and an abort resets every
// partition to its committed offset.
func (w *Writer) rewind(win *window, stops map[tp]stop) bool {
	w.insertMu.Lock()
	defer w.insertMu.Unlock()
	if w.revoked.Load() {
		return false
	}
	cl := w.sess.Client()
	before := cl.UncommittedOffsets()
	set := map[string]map[int32]kgo.EpochOffset{}
	for k, st := range stops {
		last, ok := win.last[k]
		if got := before[k.topic][k.p]; !ok || got.Offset != last+1 {
			w.log.Error("kafka client's consumed offset is not the window's: not committing the window",
				zap.String("topic", k.topic), zap.Int32("partition", k.p), zap.Int64("client", got.Offset), zap.Int64("window", last+1))
			return false
		}
		if st.offset >= last {
			continue // the refused row was the last polled: nothing to move
		}
		if set[k.topic] == nil {
			set[k.topic] = map[int32]kgo.EpochOffset{}
		}
		set[k.topic][k.p] = kgo.EpochOffset{Epoch: st.epoch, Offset: st.offset + 1}
	}
	cl.SetOffsets(set)
	after := cl.UncommittedOffsets()
	for k, st := range stops {
		if got := after[k.topic][k.p]; got.Offset != st.offset+1 {
			w.log.Error("kafka client did not take the offset past a parked row: not committing the window",
				zap.String("topic", k.topic), zap.Int32("partition", k.p), zap.Int64("client", got.Offset), zap.Int64("want", st.offset+1))
			return false
		}
	}
	return true
}

func reasonOf(r *kgo.Record) string {
	var rej schemas.Rejected
	if err := schemas.DecodeInto(r.Value, &rej); err != nil {
		return "unknown"
	}
	return rej.Reason
}

// advance records a committed window: each partition's committed offset
// moves past its last polled record (a stopped partition's: past its
// parked row), and a partition whose present rows all lie below it is
// clean again.
func (w *Writer) advance(last map[tp]int64, stops map[tp]stop) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, off := range last {
		ps, ok := w.parts[k]
		if !ok {
			continue
		}
		if st, ok := stops[k]; ok && st.offset < off {
			off = st.offset
		}
		ps.committed = off + 1
		if ps.dirty && ps.maxKnown && ps.presentMax < ps.committed {
			ps.dirty = false
			ps.maxKnown = false
		}
	}
}

// markDirty marks partitions as possibly holding rows past their committed
// offset (after a write with an unknown outcome, or an aborted window).
func (w *Writer) markDirty(parts map[tp]int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range parts {
		if ps, ok := w.parts[k]; ok {
			ps.dirty = true
			ps.maxKnown = false
		}
	}
}

func (w *Writer) markRowsDirty(t *table, rows []*row) {
	parts := map[tp]int64{}
	for _, r := range rows {
		parts[tp{t.topic, r.partition()}] = r.offset()
	}
	w.markDirty(parts)
}

// batchTable is one table's rows of one INSERT batch.
type batchTable struct {
	t     *table
	parks []parked
	// prior: the window's stops from earlier batches; stops: this batch's
	// (committed to the window only if the batch succeeds).
	prior, stops map[tp]stop
	held         int // rows held back behind a stop
}

func (ft *batchTable) heldBack(r *row) bool {
	k := tp{ft.t.topic, r.partition()}
	return heldBack(ft.prior, k, r.offset()) || heldBack(ft.stops, k, r.offset())
}

// unheld drops the rows held back behind a stop.
func (ft *batchTable) unheld(rows []*row) []*row {
	if len(ft.prior) == 0 && len(ft.stops) == 0 {
		return rows
	}
	n := 0
	for _, r := range rows {
		if !ft.heldBack(r) {
			n++
		}
	}
	if n == len(rows) {
		return rows
	}
	out := make([]*row, 0, n)
	for _, r := range rows {
		if !ft.heldBack(r) {
			out = append(out, r)
		}
	}
	ft.held += len(rows) - n
	return out
}

// writeTable inserts rows (one table's rows of a batch, in poll order: each
// partition's in offset order), except those held back behind a refused
// row, and returns the rows to park and the partitions that stop. While the
// table refuses too many rows in a row it backs off and retries; rows
// already inserted are then skipped by the resume rule.
func (w *Writer) writeTable(ctx context.Context, t *table, rows []*row, prior map[tp]stop) (*batchTable, error) {
	for attempt := 0; ; attempt++ {
		ft := &batchTable{t: t, prior: prior, stops: map[tp]stop{}}
		err := w.writeRows(ctx, ft, rows)
		if !errors.Is(err, errTooManyRefused) {
			if err == nil {
				w.clearBlocked()
			}
			return ft, err
		}
		// Nothing found in this attempt is parked; the rows held back
		// behind its refusals were not inserted, and are tried again.
		w.markRowsDirty(t, rows)
		w.setBlocked(fmt.Sprintf("clickhouse refuses more than %d rows in a row of %s (schema drift? a failing MATERIALIZED column?); not parking them, retrying", w.cfg.MaxRefusedInARow, t.name))
		w.log.Error("table refuses most rows: backing off instead of parking them", zap.String("table", t.name),
			zap.Int("refused_in_a_row", t.refusedRun), zap.Int("rows", len(rows)))
		if err := w.backoffSleep(ctx, attempt); err != nil {
			return nil, err
		}
	}
}

// writeRows writes rows, retrying while ClickHouse is unavailable, and
// splitting a refused block in two, first half first, so that each
// partition's rows are handled in offset order: once a partition's first
// refused row is found, its later rows are held back (DESIGN §7: the row is
// parked before any higher offset of its partition is inserted).
func (w *Writer) writeRows(ctx context.Context, ft *batchTable, rows []*row) error {
	t := ft.t
	for attempt := 0; ; attempt++ {
		rows = ft.unheld(rows)
		if len(rows) == 0 {
			return nil
		}
		todo, err := w.filterPresent(ctx, t, rows)
		if errors.Is(err, errAbandon) {
			return err
		}
		if err != nil {
			w.unavailable(t, err, "resume lookup")
			if err := w.backoffSleep(ctx, attempt); err != nil {
				return err
			}
			continue
		}
		if len(todo) == 0 {
			return nil
		}
		err = w.insert(ctx, t, todo)
		switch {
		case err == nil:
			t.refusedRun = 0
			w.endUnknownSpell()
			return nil
		case errors.Is(err, errAbandon):
			return err
		case classify(err) == classRefused:
			// Some parts of the block may be written (a failure after the
			// first partition's part, or after the first of several
			// blocks): the partitions are dirty.
			w.markRowsDirty(t, todo)
			w.m.insertErrors.WithLabelValues(t.name, "refused").Inc()
			if len(todo) == 1 {
				return w.refuse(ctx, ft, todo[0], err)
			}
			w.log.Info("block refused; splitting it to find the refused rows",
				zap.String("table", t.name), zap.Int("rows", len(todo)), zap.Error(err))
			mid := len(todo) / 2
			if err := w.writeRows(ctx, ft, todo[:mid]); err != nil {
				return err
			}
			// writeRows drops the second half's rows held back behind a
			// refusal found in the first.
			return w.writeRows(ctx, ft, todo[mid:])
		default:
			// Unreachable, unable to take any block, or an error code the
			// sink does not know: the outcome of the INSERT is unknown, so
			// the partitions are dirty. Nothing is parked.
			w.markRowsDirty(t, todo)
			if err := w.unknownSpell(t, err); err != nil {
				return err
			}
			w.unavailable(t, err, "insert")
			if err := w.backoffSleep(ctx, attempt); err != nil {
				return err
			}
		}
	}
}

// refuse records a row refused by ClickHouse or the driver. A row to park
// stops its partition for the rest of the window.
func (w *Writer) refuse(ctx context.Context, ft *batchTable, r *row, cause error) error {
	ft.t.refusedRun++
	if ft.t.refusedRun > w.cfg.MaxRefusedInARow {
		return errTooManyRefused
	}
	detail := fmt.Sprintf("sink: clickhouse refused the row for %s: %v", ft.t.name, cause)
	if ft.t.rejected {
		// Never park a row of the rejected topic: it would loop. It goes
		// to usage_quarantine now, before any later row is inserted; the
		// resume rule then never writes it to usage_rejected too.
		return w.writeQuarantine(ctx, []*row{quarantineRow(r.rec, schemas.ReasonUninsertable, detail)})
	}
	rec, err := w.parkRecord(r.rec, r.id, schemas.ReasonUninsertable, detail)
	if err != nil {
		return err
	}
	ft.parks = append(ft.parks, parked{table: ft.t, row: r, rec: rec, err: cause.Error()})
	// Rows are tried in offset order per partition and held back behind a
	// stop, so this is the partition's first refused row of the window.
	ft.stops[tp{ft.t.topic, r.partition()}] = stop{offset: r.offset(), epoch: r.rec.LeaderEpoch}
	w.log.Info("row refused: its partition's later rows are held back until it is parked",
		zap.String("table", ft.t.name), zap.Int32("partition", r.partition()), zap.Int64("offset", r.offset()))
	return nil
}

// writeQuarantine writes records of the rejected topic that cannot be rows
// of usage_rejected to usage_quarantine, with their raw bytes, each once:
// it first looks up which of their (partition, offset) pairs the table
// already holds (a crash, an aborted window or a rebalance may fall after
// an earlier INSERT of them and before the offset commit), and inserts the
// others. Guarantee on return without error: every one of rows is in
// usage_quarantine, and the window's offsets may move past them. While
// that fails it backs off and retries, as when ClickHouse is unavailable
// (the quarantine is where such records go last: they are never skipped);
// an error code it does not know stops the sink after UnknownErrorLimit.
func (w *Writer) writeQuarantine(ctx context.Context, rows []*row) error {
	q := w.quarantine
	for attempt := 0; ; attempt++ {
		what := "resume lookup"
		todo, err := w.quarantineMissing(ctx, rows)
		if err == nil && len(todo) > 0 {
			what = "insert"
			err = w.insert(ctx, q, todo)
		}
		if err == nil {
			w.endUnknownSpell()
			w.clearBlocked()
			for _, r := range todo {
				u := r.msg.(*unreadable)
				w.m.quarantined.WithLabelValues(u.reason).Inc()
				w.m.rows.WithLabelValues(TableRejected, outcomeQuarantined).Inc()
				w.log.Error("record of the rejected topic cannot be written to "+TableRejected+" and is never parked again: written to "+TableQuarantine+" with its raw bytes",
					zap.String("record", describe(q, r.rec)), zap.String("reason", u.reason), zap.String("detail", u.detail))
			}
			return nil
		}
		if errors.Is(err, errAbandon) {
			return err
		}
		if what == "insert" {
			w.markRowsDirty(q, todo) // q's topic is the rejected topic
			if err := w.unknownSpell(q, err); err != nil {
				return err
			}
		}
		w.unavailable(q, err, what)
		if err := w.backoffSleep(ctx, attempt); err != nil {
			return err
		}
	}
}

// quarantineRow is a usage_quarantine row for record r.
func quarantineRow(r *kgo.Record, reason, detail string) *row {
	return &row{rec: r, msg: &unreadable{reason: reason, detail: detail}}
}

// quarantineMissing returns the rows whose (partition, offset) is not in
// usage_quarantine yet.
func (w *Writer) quarantineMissing(ctx context.Context, rows []*row) ([]*row, error) {
	present, err := w.lookup(ctx, w.quarantine, "kafka_offset", offsetConds(rows, nil), false)
	if err != nil {
		return nil, err
	}
	out := make([]*row, 0, len(rows))
	for _, r := range rows {
		if !present.has(r.partition(), r.offset()) {
			out = append(out, r)
		}
	}
	return out, nil
}

// offsetConds returns one lookup condition per partition naming the rows'
// exact offsets (and their chunks, for the primary index), for the rows
// keep accepts (all when nil).
func offsetConds(rows []*row, keep func(*row) bool) []string {
	byPart := map[int32][]int64{}
	for _, r := range rows {
		if keep == nil || keep(r) {
			byPart[r.partition()] = append(byPart[r.partition()], r.offset())
		}
	}
	var conds []string
	for _, p := range sortedKeys(byPart) {
		offs := byPart[p]
		lo, hi := offs[0], offs[0]
		list := make([]string, len(offs))
		for i, o := range offs {
			lo, hi = min(lo, o), max(hi, o)
			list[i] = strconv.FormatInt(o, 10)
		}
		conds = append(conds, fmt.Sprintf("(kafka_partition = %d AND intDiv(kafka_offset, %d) BETWEEN %d AND %d AND kafka_offset IN (%s))",
			p, resumeChunk, lo/resumeChunk, hi/resumeChunk, strings.Join(list, ", ")))
	}
	return conds
}

// unknownSpell handles an INSERT failure of t. For an error code the sink
// does not know (classUnknown) it starts or continues the spell of such
// failures, and returns an error wrapping ErrUnknownServerError once the
// spell has lasted UnknownErrorLimit; otherwise it returns nil and the
// caller backs off as when ClickHouse is unavailable.
//
// Why stop rather than park: the rows may be fine (a dictionary or a
// setting missing on the server fails every block alike), and parking
// moves billing rows out of the ledger; nor back off forever behind a
// "blocked" gauge: an error nobody classified needs a person, and a
// stopped sink (non-zero exit, /readyz down, its lag growing) is what
// alerts one. Nothing is lost: no offset was committed past these rows,
// and the restart's resume rule skips any that did land.
func (w *Writer) unknownSpell(t *table, err error) error {
	if classify(err) != classUnknown {
		return nil
	}
	var ex *proto.Exception
	errors.As(err, &ex)
	now := time.Now()
	if w.unknownSince.IsZero() {
		w.unknownSince = now
		w.log.Warn("clickhouse failed an INSERT with an error code the sink does not know: not parking the rows (they may be fine), backing off as if unavailable",
			zap.String("table", t.name), zap.Int32("code", ex.Code), zap.String("code_name", codeName(ex.Code)),
			zap.Duration("stop_after", w.cfg.UnknownErrorLimit), zap.Error(err))
	}
	if spell := now.Sub(w.unknownSince); spell >= w.cfg.UnknownErrorLimit {
		return fmt.Errorf("sink: %w: INSERTs into %s failing for %s, now with code %d (%s): %v; stopping rather than parking rows that may be fine: nothing is committed past them. Fix the server or the table (or, if the rows are at fault, add the code to the sink's refusal codes) and restart",
			ErrUnknownServerError, t.name, spell.Round(time.Second), ex.Code, codeName(ex.Code), ex.Message)
	}
	return nil
}

// endUnknownSpell: an INSERT succeeded.
func (w *Writer) endUnknownSpell() {
	if !w.unknownSince.IsZero() {
		w.log.Info("clickhouse takes INSERTs again after an unknown error", zap.Duration("after", time.Since(w.unknownSince)))
		w.unknownSince = time.Time{}
	}
}

func (w *Writer) unavailable(t *table, err error, what string) {
	kind := "unavailable"
	if what != "resume lookup" && classify(err) == classUnknown {
		kind = "unknown"
	}
	w.m.insertErrors.WithLabelValues(t.name, kind).Inc()
	if isNetErr(err) {
		w.setUp(err)
	}
	reason := fmt.Sprintf("clickhouse cannot take rows of %s (%s): %v; fetching paused, backing off, committing nothing", t.name, what, err)
	if w.blocked.Load().(string) == "" {
		w.log.Warn("clickhouse unavailable: pausing fetching and backing off; no offset is committed until the rows are written",
			zap.String("table", t.name), zap.String("during", what), zap.Error(err))
	}
	w.setBlocked(reason)
}

func (w *Writer) setBlocked(reason string) {
	w.blocked.Store(reason)
	w.m.blocked.Set(1)
	if !w.paused.Swap(true) {
		w.sess.Client().PauseFetchTopics(w.topicNames()...)
	}
}

func (w *Writer) clearBlocked() {
	if w.blocked.Load().(string) != "" {
		w.log.Info("clickhouse takes rows again; resuming")
	}
	w.blocked.Store("")
	w.m.blocked.Set(0)
}

func (w *Writer) resumeFetching() {
	if w.paused.Swap(false) {
		w.sess.Client().ResumeFetchTopics(w.topicNames()...)
	}
}

func (w *Writer) backoff(attempt int) time.Duration {
	d := w.cfg.BackoffMin
	for i := 0; i < attempt && d < w.cfg.BackoffMax; i++ {
		d *= 2
	}
	if d > w.cfg.BackoffMax {
		d = w.cfg.BackoffMax
	}
	return d
}

// backoffSleep waits before a retry. It returns errAbandon when the process
// is stopping or the partitions were revoked: the window cannot commit.
func (w *Writer) backoffSleep(ctx context.Context, attempt int) error {
	if w.revoked.Load() {
		return errAbandon
	}
	if err := sleep(ctx, w.backoff(attempt)); err != nil {
		return errAbandon
	}
	if w.revoked.Load() {
		return errAbandon
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// insert sends rows in one INSERT, column by column (one typed slice per
// column: no per-value boxing), as one block or, with InsertBlockRows, as
// several.
func (w *Writer) insert(ctx context.Context, t *table, rows []*row) error {
	w.insertMu.Lock()
	defer w.insertMu.Unlock()
	if w.revoked.Load() {
		return errAbandon
	}
	start := time.Now()
	// The INSERT runs to its own deadline even while the process stops: a
	// write cut half-way would only leave more for the resume rule.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.InsertTimeout)
	defer cancel()
	block := len(rows)
	if w.cfg.InsertBlockRows > 0 {
		block = w.cfg.InsertBlockRows
		// Without these the server squashes small blocks into one before
		// writing; with them each block is written as its own parts when
		// it arrives.
		ictx = clickhouse.Context(ictx, clickhouse.WithSettings(clickhouse.Settings{
			"min_insert_block_size_rows": 0, "min_insert_block_size_bytes": 0}))
	}
	b, err := w.getConn().PrepareBatch(ictx, t.insertSQL(w.cfg.Database))
	if err != nil {
		// Nothing was sent: never a refusal of these rows.
		return &prepareError{err}
	}
	for i := 0; i < len(rows); i += block {
		chunk := rows[i:min(i+block, len(rows))]
		for j, c := range t.columns {
			if err := b.Column(j).Append(c.slice(chunk)); err != nil {
				_ = b.Abort()
				return &driverError{column: c.name, err: err}
			}
		}
		if i+block < len(rows) {
			if err := b.Flush(); err != nil {
				_ = b.Abort()
				return err
			}
			// Guarantee: the blocks sent so far are written as parts; the
			// rest of the INSERT is not. A crash here leaves some rows of
			// the batch in the table, which the resume rule skips.
			fault.Hit(FaultMidInsert)
		}
	}
	if err := b.Send(); err != nil {
		return err
	}
	if w.hook != nil {
		w.hook(hookEvent{kind: hookInsert, table: t.name, topic: t.topic, spans: spansOf(rows)})
	}
	w.setUp(nil)
	w.m.insertSeconds.WithLabelValues(t.name).Observe(time.Since(start).Seconds())
	w.m.insertRows.WithLabelValues(t.name).Observe(float64(len(rows)))
	w.m.rows.WithLabelValues(t.name, outcomeInserted).Add(float64(len(rows)))
	return nil
}

// driverError is the driver refusing a column's values for the table's
// current column types (after schema drift, a value a column can no longer
// hold). It is a refusal of some of the rows: the block is split.
type driverError struct {
	column string
	err    error
}

func (e *driverError) Error() string {
	return "driver refused column " + e.column + ": " + e.err.Error()
}
func (e *driverError) Unwrap() error { return e.err }

// prepareError wraps a failure to start an INSERT: nothing was sent, so it
// is never a refusal of the rows, whatever the server said (a table whose
// columns drifted away from the sink's list refuses every block).
type prepareError struct{ err error }

func (e *prepareError) Error() string { return "prepare insert: " + e.err.Error() }
func (e *prepareError) Unwrap() error { return e.err }

// filterPresent applies the resume rule: for the rows' dirty partitions, it
// drops the rows whose (partition, offset) the table already holds.
func (w *Writer) filterPresent(ctx context.Context, t *table, rows []*row) ([]*row, error) {
	type span struct{ lo, hi int64 }
	spans := map[int32]*span{}
	for _, r := range rows {
		s, ok := spans[r.partition()]
		if !ok {
			spans[r.partition()] = &span{r.offset(), r.offset()}
			continue
		}
		if r.offset() < s.lo {
			s.lo = r.offset()
		}
		if r.offset() > s.hi {
			s.hi = r.offset()
		}
	}
	// Snapshot the partitions' states.
	type dirtyPart struct {
		ps             *pstate
		committed, max int64
		maxKnown       bool
		lo, hi         int64
	}
	dirty := map[int32]*dirtyPart{}
	w.mu.Lock()
	for p, s := range spans {
		ps, ok := w.parts[tp{t.topic, p}]
		if !ok {
			w.mu.Unlock()
			return nil, errAbandon // revoked: this window cannot commit
		}
		if ps.committed < 0 {
			// No committed offset: the first row consumed is the lower
			// bound. Rows at lower offsets can never be consumed again,
			// and the records between the partition's start and this row
			// were not rows.
			ps.committed = s.lo
		}
		if ps.dirty {
			dirty[p] = &dirtyPart{ps: ps, committed: ps.committed, max: ps.presentMax, maxKnown: ps.maxKnown, lo: s.lo, hi: s.hi}
		}
	}
	if len(dirty) == 0 {
		w.mu.Unlock()
		return rows, nil
	}
	// 1. The highest offset ≥ committed already in the table, per partition
	// (once per dirty spell). The query also covers the topic's other
	// dirty partitions whose lower bound is known, so that an assignment
	// costs one query per table, not one per batch.
	var unknown []int32
	for k, ps := range w.parts {
		if k.topic != t.topic || !ps.dirty || ps.maxKnown || ps.committed < 0 {
			continue
		}
		unknown = append(unknown, k.p)
		if _, ok := dirty[k.p]; !ok {
			dirty[k.p] = &dirtyPart{ps: ps, committed: ps.committed, lo: -1, hi: -2}
		}
	}
	w.mu.Unlock()
	if len(unknown) > 0 {
		sort.Slice(unknown, func(i, j int) bool { return unknown[i] < unknown[j] })
		conds := make([]string, len(unknown))
		for i, p := range unknown {
			c := dirty[p].committed
			conds[i] = fmt.Sprintf("(kafka_partition = %d AND intDiv(kafka_offset, %d) >= %d AND kafka_offset >= %d)", p, resumeChunk, c/resumeChunk, c)
		}
		maxes, err := w.lookupRows(ctx, t, "max(kafka_offset)", conds, true)
		if err != nil {
			return nil, err
		}
		w.mu.Lock()
		for _, p := range unknown {
			d := dirty[p]
			m := int64(-1)
			for off := range maxes[p] {
				m = off
			}
			d.max, d.maxKnown = m, true
			if cur := w.parts[tp{t.topic, p}]; cur == d.ps && cur.dirty && !cur.maxKnown {
				cur.maxKnown, cur.presentMax = true, m
			}
		}
		w.mu.Unlock()
	}
	// 2. Which of the rows' offsets are there.
	var conds []string
	for _, p := range sortedKeys(dirty) {
		d := dirty[p]
		if _, ok := spans[p]; !ok {
			continue // looked up for its max only
		}
		lo, hi := d.lo, d.hi
		if lo < d.committed {
			lo = d.committed
		}
		if hi > d.max {
			hi = d.max
		}
		if lo > hi {
			continue
		}
		conds = append(conds, fmt.Sprintf("(kafka_partition = %d AND intDiv(kafka_offset, %d) BETWEEN %d AND %d AND kafka_offset BETWEEN %d AND %d)",
			p, resumeChunk, lo/resumeChunk, hi/resumeChunk, lo, hi))
	}
	if len(conds) == 0 {
		return rows, nil
	}
	present, err := w.lookupRows(ctx, t, "kafka_offset", conds, false)
	if err != nil {
		return nil, err
	}
	if len(present) == 0 {
		return rows, nil
	}
	out := make([]*row, 0, len(rows))
	skipped := 0
	for _, r := range rows {
		if present.has(r.partition(), r.offset()) {
			skipped++
			continue
		}
		out = append(out, r)
	}
	if skipped > 0 {
		w.m.rows.WithLabelValues(t.name, outcomePresent).Add(float64(skipped))
		w.log.Info("resume rule: rows already in the table skipped", zap.String("table", t.name), zap.Int("rows", skipped))
	}
	return out, nil
}

func sortedKeys[V any](m map[int32]V) []int32 {
	out := make([]int32, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// offsets is a lookup's answer: per partition, offsets (or one max).
type offsets map[int32]map[int64]struct{}

func (o offsets) has(p int32, off int64) bool {
	_, ok := o[p][off]
	return ok
}

// lookup runs a resume query over the OR of conds. With agg (a max), each
// partition's set holds the one aggregate value.
func (w *Writer) lookup(ctx context.Context, t *table, what string, conds []string, agg bool) (offsets, error) {
	q := "SELECT kafka_partition, " + what + " FROM " + w.cfg.Database + "." + t.name +
		" WHERE kafka_topic = " + quote(t.topic) + " AND (" + strings.Join(conds, " OR ") + ")"
	if agg {
		q += " GROUP BY kafka_partition"
	}
	start := time.Now()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	rows, err := w.getConn().Query(qctx, q)
	if err != nil {
		return nil, fmt.Errorf("sink: resume lookup in %s: %w", t.name, err)
	}
	defer rows.Close()
	out := offsets{}
	for rows.Next() {
		var p int32
		var off int64
		if err := rows.Scan(&p, &off); err != nil {
			return nil, fmt.Errorf("sink: resume lookup in %s: %w", t.name, err)
		}
		if out[p] == nil {
			out[p] = map[int64]struct{}{}
		}
		out[p][off] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sink: resume lookup in %s: %w", t.name, err)
	}
	w.m.lookupSeconds.WithLabelValues(t.name).Observe(time.Since(start).Seconds())
	return out, nil
}

// lookupRows is lookup for the resume rule. A record of the rejected topic
// is a row of usage_rejected or of usage_quarantine, never both: for
// usage_rejected it looks in both tables, so that a record quarantined
// before a crash (ClickHouse refused it then) is not inserted into
// usage_rejected on the replay (ClickHouse may take it now).
func (w *Writer) lookupRows(ctx context.Context, t *table, what string, conds []string, agg bool) (offsets, error) {
	out, err := w.lookup(ctx, t, what, conds, agg)
	if err != nil || !t.rejected {
		return out, err
	}
	q, err := w.lookup(ctx, w.quarantine, what, conds, agg)
	if err != nil {
		return nil, err
	}
	for p, offs := range q {
		if out[p] == nil {
			out[p] = map[int64]struct{}{}
		}
		for off := range offs {
			if agg {
				for cur := range out[p] {
					if cur >= off {
						off = cur
					}
				}
				clear(out[p])
			}
			out[p][off] = struct{}{}
		}
	}
	return out, nil
}

// quote is a ClickHouse string literal.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
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

func spansOf(rows []*row) map[int32][2]int64 {
	out := map[int32][2]int64{}
	for _, r := range rows {
		s, ok := out[r.partition()]
		if !ok {
			s = [2]int64{r.offset(), r.offset()}
		}
		s[0], s[1] = min(s[0], r.offset()), max(s[1], r.offset())
		out[r.partition()] = s
	}
	return out
}
