// Package producer is the client library services use to report usage to
// Meterline. It validates each event, builds its canonical identity key
// (docs/design.md, Event identity and keys) and produces it to
// usage.events with acks=all on an idempotent Kafka producer, so that every
// copy of an event lands in the same partition and the dedup stage can
// count it exactly once.
//
// An event's identity is (customer_id, meter, event_id). The event ID must
// be chosen from facts that stay the same on every retry of the same usage —
// a request ID, or a UUID generated once when the usage happened and stored
// with it. Never generate a random ID at send time: a retry would then look
// like new usage and be billed twice. EventID derives a stable ID from such
// facts.
package producer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/meterline/meterline/schemas"
)

// FieldError names the field of an event that failed validation. Its Code
// is the rejection reason it corresponds to (invalid, oversized, in_future).
type FieldError = schemas.FieldError

// ErrInvalidEvent is wrapped by every validation error; test with errors.Is.
var ErrInvalidEvent = schemas.ErrInvalidEvent

// ErrClosed is returned by Send and SendAsync after Close.
var ErrClosed = errors.New("producer: closed")

// ErrPlainWithoutTLS is returned by New for SASL/PLAIN on a client that
// would dial the brokers without TLS (see WithSASL).
var ErrPlainWithoutTLS = errors.New("producer: SASL PLAIN sends the password in the clear; it needs TLS (WithTLS)")

// Event is one unit of usage: CustomerID used Quantity units of Meter at
// EventTime.
type Event struct {
	// EventID identifies this usage across retries. Required. See EventID.
	EventID string
	// CustomerID is who is billed. Required.
	CustomerID string
	// Meter is what is measured, e.g. "api_calls". Required.
	Meter string
	// Quantity is in the meter's base unit (tokens, bytes, ms, requests).
	// Must not be negative.
	Quantity int64
	// EventTime is when the usage happened. Required; kept to the
	// millisecond in UTC. It must be on or after 2000-01-01 and no more than
	// the allowed skew (WithMaxSkew) after now.
	EventTime time.Time
	// Source names the producing service; empty means the producer's
	// default (WithSource).
	Source string
	// Properties are optional string attributes (group-by dimensions,
	// UNIQUE_COUNT subjects). At most schemas.MaxProperties entries and
	// schemas.MaxPropertiesBytes bytes of names and values.
	Properties map[string]string
}

// Identity returns the event's identity.
func (e Event) Identity() schemas.Identity {
	return schemas.Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}
}

// Key returns the canonical Kafka record key of the event (docs/design.md,
// Event identity and keys).
func (e Event) Key() []byte { return e.Identity().Key() }

// EventID derives a deterministic event ID from facts that are the same on
// every retry of the same usage (a request ID, a job ID and a step, a
// resource and a billing minute). The parts are length-prefixed, hashed with
// SHA-256, and the first 16 bytes are returned as 32 lowercase hex digits.
//
// Never pass a value made at send time (time.Now, a fresh UUID): the ID must
// be the same when the send is retried, or the usage is billed twice.
func EventID(parts ...string) string { return schemas.EventID(parts...) }

// Defaults of the options.
const (
	DefaultBrokers = "127.0.0.1:9092"
	DefaultTopic   = "usage.events"
	DefaultMaxSkew = time.Hour
	DefaultLinger  = 5 * time.Millisecond
)

type config struct {
	brokers     []string
	topic       string
	source      string
	maxSkew     time.Duration
	maxAge      time.Duration
	now         func() time.Time
	logger      *zap.Logger
	linger      time.Duration
	maxBuffered int
	client      *kgo.Client
	kgoOpts     []kgo.Opt
	sasl        sasl.Mechanism
	tls         *tls.Config
}

// Option configures a Producer.
type Option func(*config)

// WithBrokers sets the seed brokers. Default: 127.0.0.1:9092.
func WithBrokers(addrs ...string) Option { return func(c *config) { c.brokers = addrs } }

// WithTopic sets the topic events are produced to. Default: usage.events.
func WithTopic(topic string) Option { return func(c *config) { c.topic = topic } }

// WithSource sets the Source of events that do not set their own, naming
// the producing service. Default: empty.
func WithSource(source string) Option { return func(c *config) { c.source = source } }

// WithMaxSkew sets how far after now an event time may be. Default: 1 hour,
// the dedup stage's skew S (docs/design.md, Time); a later event would be rejected
// there as in_future, so the producer refuses it up front.
func WithMaxSkew(d time.Duration) Option { return func(c *config) { c.maxSkew = d } }

// WithMaxAge sets how far before now an event time may be: an older event
// is refused as too_old. Default: 0, no bound. Dedup rejects an event W or
// more before its arrival (docs/design.md, Time), and the producer's clock
// is not the broker's: a bound that refuses only events dedup would reject
// is W plus the most the broker's clock may be behind this one (the HTTP
// ingest takes W + its max skew).
func WithMaxAge(d time.Duration) Option { return func(c *config) { c.maxAge = d } }

// WithClock sets the clock the skew check reads. Default: time.Now. It
// affects only validation; the billing time of an event is its event_time
// and its broker arrival time.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithLogger sets the logger, also used for the Kafka client. Default: no
// logging.
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.logger = l } }

// WithLinger sets how long a partition batch may wait for more records
// before it is sent. Default: 5ms.
func WithLinger(d time.Duration) Option { return func(c *config) { c.linger = d } }

// WithMaxBufferedRecords bounds records buffered but not yet acknowledged;
// SendAsync blocks when the buffer is full. Default: 100,000.
func WithMaxBufferedRecords(n int) Option { return func(c *config) { c.maxBuffered = n } }

// WithSASL authenticates the client with a SASL mechanism from franz-go's
// pkg/sasl: SCRAM-SHA-512 (scram.Auth{User: u, Pass: p}.AsSha512Mechanism())
// or PLAIN (plain.Auth{User: u, Pass: p}.AsMechanism(), only over TLS: it
// sends the password in the clear). New refuses PLAIN, whether from
// WithSASL or from kgo.SASL in WithClientOptions, with ErrPlainWithoutTLS
// unless the client dials with TLS: WithTLS with a non-nil config,
// kgo.DialTLSConfig, or a kgo.Dialer of the caller's other than a
// net.Dialer's DialContext, which New takes to provide TLS (it cannot look
// into it). There is no setting that allows PLAIN without TLS. Read
// the password from a file or the environment, never from a command-line
// argument. The principal needs only Write and Describe on the events
// topic (docs/operations.md, ACLs). A nil mechanism is no SASL. Default:
// no SASL.
func WithSASL(m sasl.Mechanism) Option { return func(c *config) { c.sasl = m } }

// WithTLS dials the brokers over TLS with the given config: RootCAs for a
// private CA, Certificates for a client certificate. An empty ServerName
// is taken from each broker's host. A nil config is plaintext. Default:
// plaintext.
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }

// WithClient makes the producer use an existing client instead of creating
// one. The client must use acks=all with idempotent writes (kgo's
// defaults) and the default partitioner, and Close does not close it.
// The options of the client New would create (WithBrokers, WithTLS,
// WithSASL, WithClientOptions) do not apply to it, and New does not check
// its SASL and TLS. Default: none; New creates a client.
func WithClient(cl *kgo.Client) Option { return func(c *config) { c.client = cl } }

// WithClientOptions appends options to the Kafka client New creates
// (TLS, SASL, hooks). Options that would break the delivery guarantee —
// fewer acks, no idempotence, another partitioner — must not be passed.
// Default: none.
func WithClientOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.kgoOpts = append(c.kgoOpts, opts...) }
}

// Producer sends usage events. It is safe for concurrent use.
type Producer struct {
	cfg     config
	cl      *kgo.Client
	ownsCl  bool
	closeMu sync.RWMutex
	closed  bool
	// ctx is canceled by Close, first, so that sends waiting for the
	// brokers or for room in the buffer give up and let Close go on.
	ctx  context.Context
	stop context.CancelFunc
}

// ClientOptions returns the kgo options a Producer uses for its client:
// acks=all, idempotent writes, the default murmur2 partitioner, and the
// batching, TLS and SASL of the given options. The produce benchmark's raw franz-go
// baseline uses the same options.
func ClientOptions(opts ...Option) []kgo.Opt {
	c := newConfig(opts)
	return c.clientOptions()
}

func newConfig(opts []Option) config {
	c := config{
		brokers:     []string{DefaultBrokers},
		topic:       DefaultTopic,
		maxSkew:     DefaultMaxSkew,
		now:         time.Now,
		logger:      zap.NewNop(),
		linger:      DefaultLinger,
		maxBuffered: 100_000,
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func (c *config) clientOptions() []kgo.Opt {
	o := []kgo.Opt{
		kgo.SeedBrokers(c.brokers...),
		kgo.DefaultProduceTopic(c.topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2, as Kafka's Java client
		kgo.ProducerLinger(c.linger),
		kgo.MaxBufferedRecords(c.maxBuffered),
		kgo.WithLogger(kzap.New(c.logger, kzap.Level(kgoLevel(c.logger)))),
	}
	if c.tls != nil {
		o = append(o, kgo.DialTLSConfig(c.tls))
	}
	if c.sasl != nil {
		o = append(o, kgo.SASL(c.sasl))
	}
	return append(o, c.kgoOpts...)
}

// kgoLevel logs the Kafka client's own messages only at warn and above
// unless the logger is at debug level.
func kgoLevel(l *zap.Logger) kgo.LogLevel {
	if l.Core().Enabled(zap.DebugLevel) {
		return kgo.LogLevelDebug
	}
	return kgo.LogLevelWarn
}

// New creates a Producer. With no options it produces to usage.events on
// 127.0.0.1:9092. It does not contact the brokers; the first send does.
func New(opts ...Option) (*Producer, error) {
	c := newConfig(opts)
	switch {
	case c.topic == "":
		return nil, errors.New("producer: topic must not be empty")
	case c.maxSkew < 0:
		return nil, fmt.Errorf("producer: max skew must not be negative (got %s)", c.maxSkew)
	case len(c.brokers) == 0 && c.client == nil:
		return nil, errors.New("producer: no brokers")
	}
	p := &Producer{cfg: c, cl: c.client}
	if p.cl == nil {
		cl, err := kgo.NewClient(c.clientOptions()...)
		if err != nil {
			return nil, fmt.Errorf("producer: kafka client: %w", err)
		}
		if plainWithoutTLS(cl) {
			cl.Close()
			return nil, ErrPlainWithoutTLS
		}
		p.cl, p.ownsCl = cl, true
	}
	p.ctx, p.stop = context.WithCancel(context.Background())
	return p, nil
}

// plainWithoutTLS reports whether cl authenticates with SASL/PLAIN (from
// WithSASL or kgo.SASL) and dials the brokers without TLS: with neither a
// TLS config (WithTLS, kgo.DialTLSConfig) nor a dialer of the caller's
// (kgo.Dialer) other than a net.Dialer's DialContext, which is kgo's own
// without TLS. Another dialer is taken to provide TLS: the producer
// cannot look into it.
func plainWithoutTLS(cl *kgo.Client) bool {
	ms, _ := cl.OptValue(kgo.SASL).([]sasl.Mechanism)
	if !slices.ContainsFunc(ms, func(m sasl.Mechanism) bool { return m != nil && m.Name() == "PLAIN" }) {
		return false
	}
	if tc, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config); tc != nil {
		return false
	}
	dial := cl.OptValue(kgo.Dialer)
	if dial == nil {
		return true
	}
	code := reflect.ValueOf(dial).Pointer()
	return code == 0 || code == netDialContext
}

// netDialContext is the code of a net.Dialer's DialContext method value,
// the dialer kgo makes when given none and no TLS config.
var netDialContext = reflect.ValueOf(new(net.Dialer).DialContext).Pointer()

// The times that epoch milliseconds (an int64) can hold.
var minMilli, maxMilli = time.UnixMilli(math.MinInt64), time.UnixMilli(math.MaxInt64)

// Record validates e and returns the Kafka record the producer would send.
// The returned error is a *FieldError for bad input.
func (p *Producer) Record(e Event) (*kgo.Record, error) {
	ue := schemas.UsageEvent{
		EventID:    e.EventID,
		CustomerID: e.CustomerID,
		Meter:      e.Meter,
		Quantity:   e.Quantity,
		Source:     e.Source,
		Properties: schemas.Properties(e.Properties),
	}
	rec := new(kgo.Record)
	if err := p.FillRecord(rec, &ue, e.EventTime); err != nil {
		return nil, err
	}
	return rec, nil
}

// FillRecord is Record for an event already in its schema form, for a
// caller that builds many records (the HTTP ingest): ue is checked as
// Record checks an Event, with the same errors, and rec gets the topic,
// the key and the value (both in one allocation). eventTime is the event's
// time: FillRecord sets ue.EventTime from it, and checks the skew at its
// full precision, as Record does. An empty ue.Source becomes the
// producer's default (WithSource). ue.Properties must be sorted by name
// with unique names (schemas.Properties makes such a list), or the event
// is refused. The error is a *FieldError for bad input; rec is then
// unchanged.
func (p *Producer) FillRecord(rec *kgo.Record, ue *schemas.UsageEvent, eventTime time.Time) error {
	_, err := p.AppendRecord(nil, rec, ue, eventTime, p.cfg.now())
	return err
}

// AppendRecord is FillRecord for a caller that builds a batch of records
// at once (the HTTP ingest), without an allocation per record: the key and
// the value are appended to buf, which is returned (grown when it must
// be), and rec's Key and Value are slices of it; the skew is checked
// against now, a reading of the producer's clock (WithClock) taken once
// for the batch, instead of a reading per record. The checks and the
// errors are FillRecord's; on an error rec is unchanged and buf is
// returned with its bytes as they were. The bytes of buf that rec refers
// to must not change until Kafka is done with rec (its ProduceRecord
// callback has run, or it was never produced).
func (p *Producer) AppendRecord(buf []byte, rec *kgo.Record, ue *schemas.UsageEvent, eventTime, now time.Time) ([]byte, error) {
	if eventTime.IsZero() {
		return buf, &FieldError{Field: "event_time", Code: schemas.ReasonInvalid, Reason: "is missing (zero)"}
	}
	if eventTime.Before(minMilli) || eventTime.After(maxMilli) {
		// UnixMilli would wrap it around to a time that may pass every
		// check below.
		return buf, &FieldError{Field: "event_time", Code: schemas.ReasonInvalid,
			Reason: fmt.Sprintf("%s is beyond the range of epoch milliseconds", eventTime.UTC().Format(time.RFC3339Nano))}
	}
	ue.EventTime = eventTime.UnixMilli()
	if ue.Source == "" {
		ue.Source = p.cfg.source
	}
	if err := ue.Validate(); err != nil {
		return buf, err
	}
	if limit := now.Add(p.cfg.maxSkew); eventTime.After(limit) {
		return buf, &FieldError{Field: "event_time", Code: schemas.ReasonInFuture,
			Reason: fmt.Sprintf("%s is more than %s after now", eventTime.UTC().Format(time.RFC3339Nano), p.cfg.maxSkew)}
	}
	if p.cfg.maxAge > 0 && eventTime.Before(now.Add(-p.cfg.maxAge)) {
		return buf, &FieldError{Field: "event_time", Code: schemas.ReasonTooOld,
			Reason: fmt.Sprintf("%s is more than %s before now: dedup would reject it as too old", eventTime.UTC().Format(time.RFC3339Nano), p.cfg.maxAge)}
	}
	id := ue.Identity()
	k := id.KeySize()
	// One allocation at most (nil: this record's bytes alone).
	buf = slices.Grow(buf, k+schemas.UsageEventSizeMax(ue))
	start := len(buf)
	out := id.AppendKey(buf)
	out = schemas.AppendUsageEvent(out, ue)
	if n := len(out) - start; n > schemas.MaxEventBytes {
		return buf, &FieldError{Field: "event", Code: schemas.ReasonOversized,
			Reason: fmt.Sprintf("encoded record is %d bytes, more than %d", n, schemas.MaxEventBytes)}
	}
	rec.Topic, rec.Key, rec.Value = p.cfg.topic, out[start:start+k:start+k], out[start+k:len(out):len(out)]
	return out, nil
}

// Send validates and sends one event and returns once the brokers have
// durably acknowledged it (acks=all), or with the error. While the brokers
// are down it waits for them as long as ctx lets it (it may return a
// little after ctx's deadline, with Kafka's last error). Retrying a failed
// Send with the same event is safe: it has the same identity. An error
// that wraps ErrInvalidEvent is the event's own, and a retry fails alike.
func (p *Producer) Send(ctx context.Context, e Event) error {
	r, err := p.Record(e)
	if err != nil {
		return err
	}
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	if err := p.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		if p.ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return fmt.Errorf("producer: send %s: %w", r.Key, err)
	}
	return nil
}

// SendAsync validates e and queues it; done is called once with nil when
// the brokers acknowledged it, or with the error. A validation error is
// passed to done before SendAsync returns. SendAsync blocks while the
// buffer is full (WithMaxBufferedRecords). done may be nil and must not
// block for long: it runs on the client's delivery goroutine. While the
// brokers are down, queued events wait for them without a bound.
func (p *Producer) SendAsync(e Event, done func(error)) {
	r, err := p.Record(e)
	if err != nil {
		if done != nil {
			done(err)
		}
		return
	}
	p.ProduceRecord(r, done)
}

// ProduceRecord queues a record built by Record. It exists so callers can
// validate and encode on several goroutines and produce in order from one.
func (p *Producer) ProduceRecord(r *kgo.Record, done func(error)) {
	p.ProduceRecords([]*kgo.Record{r}, done)
}

// ProduceRecords queues the records in order, as ProduceRecord queues
// each, with one callback for all: done is called once per record, with
// the same errors as ProduceRecord's. It costs no allocation per record.
func (p *Producer) ProduceRecords(rs []*kgo.Record, done func(error)) {
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed {
		if done != nil {
			for range rs {
				done(ErrClosed)
			}
		}
		return
	}
	promise := func(r *kgo.Record, err error) {
		if done == nil {
			return
		}
		if err != nil {
			if p.ctx.Err() != nil && !errors.Is(err, kgo.ErrClientClosed) {
				err = fmt.Errorf("%w: %w", ErrClosed, err) // canceled by Close
			}
			err = fmt.Errorf("producer: send %s: %w", r.Key, err)
		}
		done(err)
	}
	for _, r := range rs {
		p.cl.Produce(p.ctx, r, promise)
	}
}

// Flush waits until every queued event has been acknowledged or failed.
func (p *Producer) Flush(ctx context.Context) error {
	if err := p.cl.Flush(ctx); err != nil {
		return fmt.Errorf("producer: flush: %w", err)
	}
	return nil
}

// Close flushes nothing: call Flush first to wait for queued events. Queued
// events that were not acknowledged fail with an error to their callback,
// and a Send or SendAsync still waiting (for the brokers, or for room in
// the buffer) returns with an error that wraps ErrClosed or the client's
// own: such an event may or may not have been written, and sending it
// again is safe. Close is idempotent.
func (p *Producer) Close() {
	p.stop() // release the sends that wait, which hold closeMu for reading
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	if p.ownsCl {
		p.cl.Close()
	}
}

// Client returns the underlying Kafka client.
func (p *Producer) Client() *kgo.Client { return p.cl }
