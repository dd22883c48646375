package lag

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
)

// Metric names exported by a Collector. Dashboards and alerts use them;
// do not rename.
const (
	MetricRecords     = "meterline_consumer_lag_records"
	MetricSeconds     = "meterline_consumer_lag_seconds"
	MetricHeldRecords = "meterline_consumer_lag_held_records"
	MetricHeldSeconds = "meterline_consumer_lag_held_seconds"
	MetricComputed    = "meterline_consumer_lag_computed"
)

var (
	descRecords = prometheus.NewDesc(MetricRecords,
		"Records a consumer group is behind on a partition: the last stable offset minus the offset it reads next (its committed offset; without one, the partition's start); 0 when a read_committed fetch from there returns no record, so trailing transaction markers do not count.",
		[]string{"stage", "group", "topic", "partition"}, nil)
	descSeconds = prometheus.NewDesc(MetricSeconds,
		"Seconds a consumer group is behind on a partition: wall time minus the broker timestamp of the first record it has not consumed; 0 when caught up.",
		[]string{"stage", "group", "topic", "partition"}, nil)
	descHeldRecords = prometheus.NewDesc(MetricHeldRecords,
		"Records past the last stable offset of a partition a consumer group reads: the high watermark minus the last stable offset, transaction markers included; a read_committed consumer gets none of them until the transaction open at the last stable offset ends. 0 when none.",
		[]string{"stage", "group", "topic", "partition"}, nil)
	descHeldSeconds = prometheus.NewDesc(MetricHeldSeconds,
		"Seconds the last stable offset of a partition a consumer group reads has not moved while records sit past it, as this process's lag computations observed it (from the first that saw it, on the process's monotonic clock); 0 when no record is held.",
		[]string{"stage", "group", "topic", "partition"}, nil)
	descComputed = prometheus.NewDesc(MetricComputed,
		"1 when the last lag computation succeeded, 0 when it failed (a broker or the group's coordinator out of reach, an ACL missing: the status page's lag_error says why) and this process exports no lag series of the group, which no lag alert can then see.",
		[]string{"stage", "group"}, nil)
)

// Collector is a prometheus.Collector that exports the lag of consumer
// groups, per group, topic and partition, as MetricRecords and
// MetricSeconds (docs/operations.md, Health, metrics and logs), computed as
// Compute does. Each series also carries the stage label of its group
// (WithStage): under `meterline run` one process exports the lag of every
// stage, and the aggregator and the sink both read usage.deduped, so only
// the stage tells their lag apart there (the group's name is configurable).
//
// It is a collector rather than a periodic updater of gauges so that lag is
// computed only when something scrapes, and so that a partition that leaves
// a group's committed offsets (a topic deleted, a group reset) disappears
// from the output instead of lingering as a stale gauge.
//
// One computation costs an OffsetFetch per group, a ListOffsets per topic
// and, per partition that is behind, a read_committed fetch of its first
// unconsumed record. So that scraping never hammers the broker, a result
// is cached for the cache TTL (WithCacheTTL, default 5 s): every scrape
// within it (several Prometheus servers, a status page) reuses it, and
// concurrent scrapes wait for the one computation in flight and take its
// result, however long it ran (Rows). Both values are as of that
// computation, at most the TTL old (for a scrape that waited for it, as
// old as it ran), and never extrapolated:
// a record consumed right after it must not make a healthy stage look
// stuck. Prometheus's usual scrape interval (15 s) is longer than the TTL,
// so each scrape normally computes afresh.
//
// A dedup group reads its own tick records, so for a moment after each
// tick interval it is a tick behind (a few records, counting commit
// markers, and a fraction of a second); the aggregator and the sink
// likewise trail the watermark records each tick produces.
//
// Each series of a group's partition has two more beside it:
// MetricHeldRecords, the records past the partition's last stable offset
// (high watermark minus it), and MetricHeldSeconds, for how long that
// offset has not moved while records sat past it. A transaction left open
// on an input partition (a crashed producer's until its transaction
// timeout, a hanging transaction for ever) stops the last stable offset:
// the stage reads nothing past it and its lag is 0, while these grow.
// Held seconds are observed, not read from the broker: from the first
// computation that saw records past that offset, as of the latest, on
// the collector's clock (WithClock); a process that starts counts from 0.
//
// When a computation fails (broker unreachable, timeout, an ACL missing),
// the failure is logged, cached like a result, and the scrape carries no
// lag series: absent data rather than stale data. MetricComputed, one
// series per group, says which: 1 after a computation that succeeded, 0
// after one that failed, so that an alert sees lag that is not known.
// The rest of the scrape is unaffected.
type Collector struct {
	conn    kafka.Config
	groups  []string
	inputs  map[string][]string
	stages  map[string]string
	ttl     time.Duration
	timeout time.Duration
	now     func() time.Time
	log     *zap.Logger

	cl *kgo.Client

	mu      sync.Mutex    // held for a whole refresh: concurrent scrapes share it
	done    atomic.Uint64 // computations ended; read before waiting for mu
	at      time.Time     // when rows were computed; zero: never
	rows    []Row
	lastErr error
	closed  bool

	// held is, per partition with records past its last stable offset
	// at the last computation, that offset and when a computation first
	// saw it hold records; heldFor is how long, as of that computation.
	held    map[topicPartition]heldSince
	heldFor map[topicPartition]time.Duration
}

type topicPartition struct {
	topic     string
	partition int32
}

type heldSince struct {
	end   int64
	since time.Time
}

// Option configures a Collector.
type Option func(*Collector)

// WithCacheTTL sets how long one computation serves scrapes. Default: 5s.
func WithCacheTTL(d time.Duration) Option { return func(c *Collector) { c.ttl = d } }

// WithTimeout bounds one computation, which runs inside a scrape. Default:
// 5s (Prometheus's default scrape timeout is 10 s).
func WithTimeout(d time.Duration) Option { return func(c *Collector) { c.timeout = d } }

// WithClock sets the wall clock used for seconds behind, for the cache and
// for held seconds (MetricHeldSeconds). Default: time.Now, whose monotonic
// reading times the held seconds.
func WithClock(now func() time.Time) Option { return func(c *Collector) { c.now = now } }

// WithInputTopics names the topics a group consumes. A partition of one
// of them where the group has no committed offset counts as behind from the
// partition's start, where a stage's first start reads (docs/design.md,
// Exactly-once, 6), so a stage stuck before its first commit (a sink that
// never reached ClickHouse) shows its lag instead of no series at all.
// Default: only the topics the group has committed offsets on, as
// `meterline lag` shows.
func WithInputTopics(group string, topics ...string) Option {
	return func(c *Collector) { c.inputs[group] = append(c.inputs[group], topics...) }
}

// WithStage sets the stage label of group's series ("dedup", "aggregate",
// "sink"; the labels of the stream stages' own metrics). Default: empty,
// which Prometheus treats as no label.
func WithStage(group, stage string) Option {
	return func(c *Collector) { c.stages[group] = stage }
}

// WithLogger sets the logger for failed computations. Default: none.
func WithLogger(l *zap.Logger) Option { return func(c *Collector) { c.log = l } }

// NewCollector returns a Collector of the groups' lag on the cluster. It
// holds one Kafka client until Close.
func NewCollector(conn kafka.Config, groups []string, opts ...Option) (*Collector, error) {
	c := &Collector{conn: conn, groups: append([]string(nil), groups...), inputs: map[string][]string{}, stages: map[string]string{}, ttl: 5 * time.Second,
		timeout: 5 * time.Second, now: time.Now, log: zap.NewNop()}
	for _, o := range opts {
		o(c)
	}
	if len(conn.Brokers) == 0 {
		return nil, errors.New("lag: collector needs at least one seed broker")
	}
	cl, err := kafka.NewClient(conn)
	if err != nil {
		return nil, fmt.Errorf("lag: collector client: %w", err)
	}
	c.cl = cl
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRecords
	ch <- descSeconds
	ch <- descHeldRecords
	ch <- descHeldSeconds
	ch <- descComputed
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	rows, heldFor, err := c.rowsHeld()
	if c.isClosed() {
		return
	}
	computed := 1.0
	if err != nil {
		computed = 0
	}
	for _, g := range c.groups {
		ch <- prometheus.MustNewConstMetric(descComputed, prometheus.GaugeValue, computed, c.stages[g], g)
	}
	for _, r := range rows {
		p := strconv.Itoa(int(r.Partition))
		st := c.stages[r.Group]
		ch <- prometheus.MustNewConstMetric(descRecords, prometheus.GaugeValue, float64(r.Records), st, r.Group, r.Topic, p)
		ch <- prometheus.MustNewConstMetric(descSeconds, prometheus.GaugeValue, r.Behind.Seconds(), st, r.Group, r.Topic, p)
		ch <- prometheus.MustNewConstMetric(descHeldRecords, prometheus.GaugeValue, float64(r.Held()), st, r.Group, r.Topic, p)
		ch <- prometheus.MustNewConstMetric(descHeldSeconds, prometheus.GaugeValue,
			heldFor[topicPartition{r.Topic, r.Partition}].Seconds(), st, r.Group, r.Topic, p)
	}
}

// Rows returns the cached lag rows, computing them first when the cache
// is older than its TTL, and the error of that computation, if it failed.
// A call that waited for a computation in flight takes its result,
// however long it ran: against a broker that answers nothing, one runs
// for the whole timeout (the TTL by default), and were each waiting call
// to compute again in turn, N scrapes at once would take N timeouts.
func (c *Collector) Rows() ([]Row, error) {
	rows, _, err := c.rowsHeld()
	return rows, err
}

// rowsHeld is Rows, with how long each partition's records have been
// held past its last stable offset as of the same computation (absent:
// none held).
func (c *Collector) rowsHeld() ([]Row, map[topicPartition]time.Duration, error) {
	before := c.done.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, errors.New("lag: collector closed")
	}
	now := c.now()
	waited := c.done.Load() != before
	if c.at.IsZero() || !waited && (now.Sub(c.at) >= c.ttl || now.Before(c.at)) {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		rows, err := computeWith(ctx, c.cl, c.conn, c.groups, c.inputs, now, false)
		cancel()
		c.at, c.rows, c.lastErr = now, rows, err
		if err != nil {
			c.rows = nil
			c.log.Warn("consumer lag not computed; the scrape carries no lag series", zap.Strings("groups", c.groups), zap.Error(err))
		} else {
			c.observeHeld(rows, now)
		}
		c.done.Add(1)
	}
	return c.rows, c.heldFor, c.lastErr
}

// observeHeld updates, from one computation's rows at now, since when
// each partition's last stable offset has held records past it: since
// the first computation that saw records past that same offset. A
// partition whose offset moved starts again at 0; one with nothing past
// it (or gone from the rows) is forgotten. A failed computation changes
// nothing: a broker unreachable for a scrape does not restart the count.
// Durations are of c.now, whose default, time.Now, carries the monotonic
// clock: a wall clock stepped back or forth does not change them.
func (c *Collector) observeHeld(rows []Row, now time.Time) {
	held := map[topicPartition]heldSince{}
	c.heldFor = map[topicPartition]time.Duration{}
	for _, r := range rows {
		k := topicPartition{r.Topic, r.Partition}
		if r.Held() == 0 {
			continue
		}
		if _, seen := held[k]; seen { // another group on the same partition
			continue
		}
		h, ok := c.held[k]
		if !ok || h.end != r.End {
			h = heldSince{end: r.End, since: now}
		}
		held[k] = h
		c.heldFor[k] = max(now.Sub(h.since), 0)
	}
	c.held = held
}

// LastError returns the error of the last computation, nil when it
// succeeded or none has run yet: a scrape after a failed one carries no
// lag series (the status page says why).
func (c *Collector) LastError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// isClosed reports whether Close has run.
func (c *Collector) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close releases the Kafka client. It is idempotent; a closed Collector
// exports nothing.
func (c *Collector) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.cl.Close()
	}
}
