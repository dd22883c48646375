// Package ingest is Meterline's HTTP ingest (docs/ingest.md): usage over
// HTTP for services that do not speak Kafka, compatible with OpenMeter's
// event API so that its published SDKs work unchanged.
//
//   - POST /api/v1/events takes one CloudEvent (application/cloudevents+json)
//     or a batch (application/cloudevents-batch+json, or application/json
//     with an object or an array). The meters file maps each event's type
//     to the meters it feeds (aggregator.Meter.EventType).
//   - POST /v1/events takes Meterline's own JSON events (producer.ParseJSON):
//     one object, an array, or NDJSON.
//
// Delivery guarantee: a request is answered with success (204 on the
// OpenMeter path, as OpenMeter answers; 202 on /v1/events) only after every
// usage event it carries is acknowledged by the Kafka brokers (acks=all on
// an idempotent producer). A request is all or nothing: one bad event and
// nothing is sent (400 naming each bad event). When Kafka does not
// acknowledge in time the answer is 503, never a success; some events may
// still have been written, and a retry is safe, since every copy has the
// same identity and dedup counts it once. When Kafka refuses every record
// because the ingest may not write the topic, the answer is 503
// not-authorized, and when it refuses every record for good
// (MESSAGE_TOO_LARGE, INVALID_RECORD) 503 kafka-refused: none was written.
//
// Keys (keys.go) are per tenant and stored hashed in a compacted topic
// that every replica follows.
package ingest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"math"
	"mime"
	"net"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/tlsconfig"
	"github.com/meterline/meterline/producer"
)

// FaultAfterAck is the fault point (internal/fault) between Kafka's
// acknowledgement of a request's events and the response: a crash there
// leaves the events written and the client without an answer, so the
// client retries and dedup drops the copies.
const FaultAfterAck = "ingest.after-ack"

// Defaults of Config.
const (
	DefaultAddr           = "127.0.0.1:8888"
	DefaultKeysTopic      = "meterline.keys"
	DefaultMaxBodyBytes   = 1 << 20
	DefaultMaxEvents      = 1000
	DefaultProduceTimeout = 10 * time.Second
	DefaultLinger         = 2 * time.Millisecond
	DefaultBalancesTopic  = "usage.balances"
	// DefaultGateMaxAge is the age (in broker time) past which the quota
	// gate no longer trusts a balance: far above the aggregator's
	// DefaultBalanceInterval (1 s), the most a changed balance waits
	// before it goes out, so a balance still trusted is at most seconds
	// behind the customer's usage when the aggregator keeps up.
	DefaultGateMaxAge = 5 * time.Minute
	// DefaultAuthMaxAge is how long a replica serves with keys it has not
	// confirmed current (Config.AuthMaxAge): minutes, well beyond a
	// leader election or a broker's restart (seconds), so that these do
	// not turn into 503s, and short enough that a revoked key stops
	// working on every replica within a few minutes whatever happens.
	DefaultAuthMaxAge = 2 * time.Minute
	// The HTTP server's timeouts.
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	// DefaultMaxInFlight bounds the requests served at once (503 beyond):
	// with DefaultMaxBodyBytes, at most 256 MiB of bodies held.
	DefaultMaxInFlight = 256
	// DefaultMaxInFlightPerTenant bounds the requests of one tenant (all
	// its keys) served at once (429 beyond): a quarter of
	// DefaultMaxInFlight, room for a fleet of services that share one
	// tenant, sending an event a request; with the fair share (inflight)
	// it takes 10 tenants holding their bound (clients that trickle their
	// bodies, say) to leave no slot for the others.
	DefaultMaxInFlightPerTenant = 64
	// DefaultRefusalRate is the refusal budget of a key without a rate:
	// the events of one full request (DefaultMaxEvents) refused per
	// second, per replica. A refused request costs the replica about as
	// much CPU per event as an accepted one (BenchmarkRefusalCPU) but
	// waits for no acknowledgement, and its body can be 36 times smaller
	// ("[{},{},...]"); at this budget one key's refusals take at most
	// about 2% of a core (a refusal of one byte costs 18 µs and a token).
	DefaultRefusalRate = 1000
	// MaxConnectionsCeiling is the most DefaultMaxConnections gives: at
	// about 16 KB and a goroutine a connection, 64 MiB, and more
	// keep-alive connections than the services sending to one replica
	// hold (a thousand instances with a pool of four each).
	MaxConnectionsCeiling = 4096
	// minDefaultMaxConnections is the least DefaultMaxConnections gives.
	minDefaultMaxConnections = 16
)

// DefaultMaxConnections is Config.MaxConnections by default: half the
// process's limit on open files (RLIMIT_NOFILE, which Go raises to the
// hard limit at start), at most MaxConnectionsCeiling (at least 16). The
// other half is left to what else needs a file descriptor: the Kafka
// clients (a few connections to each broker, each client; in meterline
// run the other stages' too, and their state files), the metrics server
// and the logs. With the common limits, 4096 of 65,536 or more, and 512
// of 1,024.
func DefaultMaxConnections() int { return defaultMaxConnections(openFileLimit()) }

// defaultMaxConnections is DefaultMaxConnections for a limit of nofile
// open files (0: unknown, the ceiling).
func defaultMaxConnections(nofile uint64) int {
	if nofile == 0 || nofile/2 >= MaxConnectionsCeiling {
		return MaxConnectionsCeiling
	}
	return max(int(nofile/2), minDefaultMaxConnections)
}

// DefaultMaxAge is Config.MaxAge for dedup's window and the ingest's
// max skew: the window plus the skew, the margin for the ingest's clock
// being ahead of the broker's (Config.MaxAge).
func DefaultMaxAge(window, maxSkew time.Duration) time.Duration { return window + maxSkew }

// Config configures a Server.
type Config struct {
	// Addr is the listen address. Default: 127.0.0.1:8888 (loopback only;
	// docs/ingest.md, Running it).
	Addr string
	// TLSCertFile and TLSKeyFile, when both set, serve HTTPS.
	TLSCertFile, TLSKeyFile string

	// Kafka is the connection to the cluster (seed brokers, SASL, TLS) of
	// the producer and of the keys topic's reader, as every stage takes
	// it. Kafka.Brokers is required.
	Kafka kafka.Config
	// ClientOptions are added to every Kafka client (tests' hooks).
	ClientOptions []kgo.Opt
	// Topic is where usage events go. Default: usage.events.
	Topic string
	// KeysTopic is the compacted topic of API keys and tenants. Default:
	// meterline.keys.
	KeysTopic string
	// AuthMaxAge bounds the age of the keys: the time since the replica
	// last confirmed it had read the keys topic to its end (its ends
	// listed, then reached by the read; every 5 s, or a quarter of the
	// bound when less). Past it every request is answered 503 with
	// Retry-After, and the replica is not ready, until it confirms again:
	// a key revoked meanwhile is never accepted past the bound.
	// Default: DefaultAuthMaxAge; negative: no bound.
	AuthMaxAge time.Duration
	// Linger is the producer's linger. Default: 2ms.
	Linger time.Duration

	// Meters maps CloudEvent types to meters. Nil: /api/v1/events refuses
	// every event (unknown_event_type).
	Meters *aggregator.Catalog
	// StrictMeters refuses, on /v1/events, events of meters the meters
	// file does not declare (unknown_meter), as the aggregator would.
	StrictMeters bool
	// RequireTime refuses CloudEvents without a time. Default: such an
	// event gets the time the request was received, as in OpenMeter.
	RequireTime bool
	// MaxSkew is how far after now an event time may be. Default: 1h.
	MaxSkew time.Duration
	// MaxAge is how far before now an event time may be (too_old beyond).
	// Default: dedup's default window W plus MaxSkew (DefaultMaxAge);
	// negative: no bound. Dedup rejects an event W or more before its
	// arrival, judged by the broker's clock (docs/design.md, Time); the
	// ingest judges by its own, which the broker's may be behind. MaxSkew,
	// the most an event time may be ahead of the broker's clock, is the
	// margin: an event is refused only when it is more than W + MaxSkew
	// before the ingest's clock, so that no event dedup would accept is
	// refused while the two clocks are within MaxSkew of each other.
	MaxAge time.Duration

	// MaxBodyBytes bounds a request body (413). Default: 1 MiB.
	MaxBodyBytes int64
	// MaxEvents bounds the events of one request (413). Default: 1000.
	MaxEvents int
	// MaxInFlight bounds the requests with a valid key served at once
	// (503 overloaded beyond); MaxInFlightPerTenant bounds those of one
	// tenant, all its keys together (429 too-many-in-flight). Each may
	// hold a body of MaxBodyBytes. Besides, a tenant is admitted only
	// while it holds fewer requests than there are free slots of
	// MaxInFlight (429 too-many-in-flight): the last slots go to the
	// tenants that hold the fewest. Defaults: DefaultMaxInFlight (256)
	// and DefaultMaxInFlightPerTenant (64); negative: no bound (a
	// negative MaxInFlight: no share either).
	MaxInFlight, MaxInFlightPerTenant int
	// MaxConnections bounds the connections open at once, idle keep-alive
	// ones and those that have not sent a request yet included: each
	// holds a file descriptor. A connection past it makes room: the one
	// that has waited the longest without a request in flight (idle
	// between requests, or not having sent one) is closed; when every
	// open connection has a request in flight, the new one is closed at
	// once. A connection with a request in flight is never closed by it.
	// Default: DefaultMaxConnections() (half the open-file limit, at most
	// 4096); negative: no bound.
	MaxConnections int
	// RefusalRate is the refusal budget of a key without a rate of its
	// own, in events per second on this replica: its refused requests
	// (400, 403, 413, 415) take from a bucket of this rate, as a key's
	// rate does, and past it the key's requests are answered 429
	// rate-limited before their bodies are read. Its accepted events take
	// nothing. Default: DefaultRefusalRate; negative: no budget.
	RefusalRate float64
	// ProduceTimeout bounds the wait for Kafka's acknowledgement; past it
	// the answer is 503. Default: 10s.
	ProduceTimeout time.Duration
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout bound slow clients.
	// Defaults: 5s, 30s, 120s. The write timeout is ProduceTimeout + 10s,
	// counted from the end of the request's body.
	ReadHeaderTimeout, ReadTimeout, IdleTimeout time.Duration
	// ShutdownTimeout bounds the graceful shutdown: in-flight requests are
	// answered (success or 503) before it ends. Default: ProduceTimeout +
	// 5s.
	ShutdownTimeout time.Duration

	// BalancesTopic is usage.balances, which the advisory quota gate
	// follows. Default: usage.balances.
	BalancesTopic string
	// GateMaxAge is the age past which the quota gate no longer trusts a
	// balance, judged in broker time (Balances). Default: 5m.
	GateMaxAge time.Duration
	// NoGate turns the advisory quota gate off: the balances topic is
	// not read and no request is answered 402.
	NoGate bool

	// Trace, when set, receives the stage timings of every successful
	// request (diagnosis and benchmarks). It is called on the request's
	// goroutine and must not block.
	Trace func(Timings)

	// Logger receives the logs. Default: none.
	Logger *zap.Logger
	// Registerer receives the metrics. Default: none.
	Registerer prometheus.Registerer
	// Clock is the time a request is received. Default: time.Now.
	Clock func() time.Time
}

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Topic == "" {
		c.Topic = producer.DefaultTopic
	}
	if c.KeysTopic == "" {
		c.KeysTopic = DefaultKeysTopic
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.BalancesTopic == "" {
		c.BalancesTopic = DefaultBalancesTopic
	}
	if c.GateMaxAge == 0 {
		c.GateMaxAge = DefaultGateMaxAge
	}
	if c.AuthMaxAge == 0 {
		c.AuthMaxAge = DefaultAuthMaxAge
	}
	if c.MaxSkew == 0 {
		c.MaxSkew = producer.DefaultMaxSkew
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge(dedup.DefaultWindow, c.MaxSkew)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxEvents == 0 {
		c.MaxEvents = DefaultMaxEvents
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxInFlightPerTenant == 0 {
		c.MaxInFlightPerTenant = DefaultMaxInFlightPerTenant
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections()
	}
	if c.RefusalRate == 0 {
		c.RefusalRate = DefaultRefusalRate
	}
	if c.ProduceTimeout == 0 {
		c.ProduceTimeout = DefaultProduceTimeout
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = c.ProduceTimeout + 5*time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
}

// Validate reports every problem with the config at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("ingest: "+format, args...)) }
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("ingest: %w", err))
	}
	// The certificate and key are loaded as Run loads them (a start, and
	// --validate, find a key that is not the certificate's). The key file
	// is named only when its name is one (tlsconfig.LoadKeyPair): a key
	// set where its file's name belongs is never shown.
	switch {
	case c.TLSCertFile != "" && c.TLSKeyFile == "":
		bad("tls-key-file: required with tls-cert-file %q (give both, or neither)", c.TLSCertFile)
	case c.TLSKeyFile != "" && c.TLSCertFile == "":
		bad("tls-cert-file: required with tls-key-file (give both, or neither)")
	case c.TLSKeyFile != "":
		if _, err := tlsconfig.LoadKeyPair(c.TLSCertFile, c.TLSKeyFile); err != nil {
			bad("%w", err)
		}
	}
	if c.MaxBodyBytes < 1024 {
		bad("max-body-bytes %d: want at least 1024", c.MaxBodyBytes)
	}
	if c.MaxEvents < 1 {
		bad("max-events %d: want at least 1", c.MaxEvents)
	}
	if math.IsNaN(c.RefusalRate) || math.IsInf(c.RefusalRate, 0) {
		bad("refusal-rate %v: want a number (negative: no budget)", c.RefusalRate)
	}
	if c.ProduceTimeout < time.Second {
		bad("produce-timeout %s: want at least 1s (Kafka's record timeout)", c.ProduceTimeout)
	}
	for name, d := range map[string]time.Duration{"read-header-timeout": c.ReadHeaderTimeout, "read-timeout": c.ReadTimeout,
		"idle-timeout": c.IdleTimeout, "shutdown-timeout": c.ShutdownTimeout, "max-skew": c.MaxSkew, "linger": c.Linger,
		"gate-max-age": c.GateMaxAge} {
		if d < 0 {
			bad("%s %s: must not be negative", name, d)
		}
	}
	if c.ShutdownTimeout > 0 && c.ShutdownTimeout < c.ProduceTimeout {
		bad("shutdown-timeout %s is shorter than produce-timeout %s: in-flight requests could go unanswered", c.ShutdownTimeout, c.ProduceTimeout)
	}
	return errors.Join(errs...)
}

// kafkaOpts are the client options of every Kafka client of the ingest:
// the connection (seed brokers, SASL, TLS), then ClientOptions.
func (c *Config) kafkaOpts() ([]kgo.Opt, error) {
	conn, err := c.Kafka.Opts()
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	return append(conn, c.ClientOptions...), nil
}

// ProducerOptions are the producer options of the ingest: acks=all on an
// idempotent producer (producer's defaults), the linger, a record delivery
// timeout of ProduceTimeout, and the connection of Kafka. Call after
// EnsureDefaults.
func (c *Config) ProducerOptions() ([]producer.Option, error) {
	opts, err := c.kafkaOpts()
	if err != nil {
		return nil, err
	}
	return []producer.Option{
		producer.WithBrokers(c.Kafka.Brokers...),
		producer.WithTopic(c.Topic),
		producer.WithLinger(c.Linger),
		producer.WithMaxSkew(c.MaxSkew),
		producer.WithMaxAge(c.MaxAge), // negative: no bound
		producer.WithClock(c.Clock),
		producer.WithLogger(c.Logger),
		producer.WithClientOptions(append([]kgo.Opt{kgo.RecordDeliveryTimeout(c.ProduceTimeout)}, opts...)...),
	}, nil
}

// Server is the HTTP ingest.
type Server struct {
	cfg  Config
	log  *zap.Logger
	p    *producer.Producer
	keys *Keys
	// balances feeds the quota gate; nil when it is off (NoGate).
	balances *Balances
	mapper   *mapper
	metrics  *metrics
	limits   *limiters
	inflight *inflight
	conns    *conns
	ln       net.Listener
	srv      *http.Server
	scheme   string
	// maxBuffered: see the constant.
	maxBuffered int64
	// gateLog and kafkaLog bound the lines of a 402 (answerGate) and of a
	// 503 for records Kafka did not take.
	gateLog, kafkaLog *logBound
	// loginRefused holds the error that stops Run when the brokers refuse
	// the producer's SASL login (refusedLogin).
	loginRefused chan error

	closeOnce sync.Once
}

// New checks cfg, makes the producer and binds the listen address. Run
// serves.
func New(cfg Config) (*Server, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	mp, err := newMapper(cfg.Meters)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, keys: NewKeys(cfg.KeysTopic, cfg.Logger), mapper: mp,
		limits: newLimiters(cfg.MaxEvents, cfg.RefusalRate), inflight: newInflight(cfg.MaxInFlight, cfg.MaxInFlightPerTenant), scheme: "http", maxBuffered: maxBuffered,
		conns: newConns(cfg.MaxConnections, cfg.Logger), gateLog: newLogBound(), kafkaLog: newLogBound(), loginRefused: make(chan error, 1)}
	s.keys.SetMaxAge(cfg.AuthMaxAge)
	if !cfg.NoGate {
		s.balances = NewBalances(cfg.BalancesTopic, cfg.Logger, cfg.Clock)
	}
	s.metrics = newMetrics(cfg.Registerer, s.keys, s.balances, s.inflight, s.conns)
	var tlsCfg *tls.Config
	if cfg.TLSCertFile != "" {
		// The errors never show a key set where its file's name belongs.
		cert, err := tlsconfig.LoadKeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("ingest: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		s.scheme = "https"
	}
	popts, err := cfg.ProducerOptions()
	if err != nil {
		return nil, err
	}
	// The producer's connections report a refused login (refusedLogin):
	// its records then only time out.
	popts = append(popts, producer.WithClientOptions(kgo.WithHooks(producerLogin{s})))
	if s.p, err = producer.New(popts...); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		s.p.Close()
		return nil, fmt.Errorf("ingest: listen %s: %w", cfg.Addr, err)
	}
	// Under TLS, so that connState sees the client's reads fail
	// (watchConn).
	ln = watchListener{ln}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	// The bound on connections applies outside TLS: a connection closed
	// at once costs no handshake.
	s.ln = capListener{ln, s.conns}
	s.srv = &http.Server{
		Handler:           guard(s.Handler()),
		ConnState:         s.conns.connState,
		ConnContext:       s.conns.connContext,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.ProduceTimeout + 10*time.Second,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          newErrorLog(cfg.Logger),
	}
	return s, nil
}

// errorLogBurst and errorLogRate bound the lines a client can cause, one
// a connection or a request (logBound): at most errorLogBurst at once,
// then errorLogRate a second.
const (
	errorLogBurst = 10
	errorLogRate  = 1
)

// logBound bounds a kind of log line that a client can cause at will
// (errorLogBurst, errorLogRate); the next line written counts those left
// out.
type logBound struct {
	lim     *rate.Limiter
	leftOut atomic.Int64
}

func newLogBound() *logBound { return &logBound{lim: rate.NewLimiter(errorLogRate, errorLogBurst)} }

// allow reports whether a line may be written now, and the fields it
// adds to it: the count of the lines left out before it, if any.
func (b *logBound) allow() ([]zap.Field, bool) {
	if !b.lim.Allow() {
		b.leftOut.Add(1)
		return nil, false
	}
	if n := b.leftOut.Swap(0); n > 0 {
		return []zap.Field{zap.Int64("left_out", n)}, true
	}
	return nil, true
}

// errorLog is where net/http reports what it does not answer through the
// handler (a TLS handshake that failed, a handler's panic), at Warn. A
// client can cause one line per connection it opens, so the lines are
// bounded (logBound).
type errorLog struct {
	log   *zap.Logger
	bound *logBound
}

func newErrorLog(log *zap.Logger) *stdlog.Logger {
	return stdlog.New(&errorLog{log: log, bound: newLogBound()}, "", 0)
}

func (e *errorLog) Write(p []byte) (int, error) {
	if fs, ok := e.bound.allow(); ok {
		e.log.Warn("ingest: HTTP server: "+strings.TrimSpace(string(p)), fs...)
	}
	return len(p), nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the base URL of the server ("http://127.0.0.1:8888").
func (s *Server) URL() string { return s.scheme + "://" + s.Addr() }

// Keys is the server's key set.
func (s *Server) Keys() *Keys { return s.keys }

// Ready returns nil once the keys are loaded, while they are not older
// than AuthMaxAge, or why not.
func (s *Server) Ready() error {
	_, _, err := s.keysUnavailable()
	return err
}

// keysUnavailable returns why no request can be served with the keys
// held, with the detail and Retry-After of the 503; nil when they can.
func (s *Server) keysUnavailable() (detail string, retry time.Duration, err error) {
	select {
	case <-s.keys.Loaded():
	default:
		return "the API keys are not loaded yet", time.Second, errors.New("ingest: API keys not loaded yet")
	}
	if age, stale := s.keys.Staleness(); stale {
		return "the API keys could not be confirmed current (the keys topic is out of reach); retry", s.keys.probe, fmt.Errorf("ingest: API keys stale: the keys topic %s not confirmed read to its end for %s (--auth-max-age %s); a key revoked since may not be known here",
			s.cfg.KeysTopic, age.Round(time.Second), s.cfg.AuthMaxAge)
	}
	return "", 0, nil
}

// Run follows the keys topic (and the balances topic, unless NoGate) and serves until ctx ends, then shuts down
// gracefully: it stops accepting, answers every request in flight
// (success or 503) within ShutdownTimeout, and flushes and closes the
// producer. It returns every error, including those of the shutdown.
func (s *Server) Run(ctx context.Context) error {
	defer s.close()
	if err := s.initProducerID(ctx); err != nil {
		return err
	}
	keysCtx, stopKeys := context.WithCancel(context.WithoutCancel(ctx))
	defer stopKeys()
	keysDone := make(chan error, 1)
	go func() {
		opts, err := s.cfg.kafkaOpts()
		if err != nil {
			keysDone <- err
			return
		}
		keysDone <- s.keys.Follow(keysCtx, opts...)
	}()
	// The balances are followed as long as the keys; Follow never fails
	// (the gate is advisory), so it is only waited for.
	balancesDone := make(chan struct{})
	go func() {
		defer close(balancesDone)
		if opts, err := s.cfg.kafkaOpts(); err == nil && s.balances != nil {
			_ = s.balances.Follow(keysCtx, opts...)
		}
	}()
	serveDone := make(chan error, 1)
	go func() { serveDone <- s.srv.Serve(s.ln) }()
	s.log.Info("ingest serving", zap.String("url", s.URL()), zap.String("topic", s.cfg.Topic), zap.String("keys_topic", s.cfg.KeysTopic),
		zap.Duration("keys_max_age", s.cfg.AuthMaxAge), zap.Bool("quota_gate", s.balances != nil), zap.String("balances_topic", s.cfg.BalancesTopic),
		zap.Duration("gate_max_age", s.cfg.GateMaxAge), zap.Int("max_connections", s.cfg.MaxConnections))
	s.warnOpenFiles(openFileLimit())
	s.warnPlaintext()

	var errs []error
	select {
	case <-ctx.Done():
	case err := <-serveDone:
		serveDone <- err
		errs = append(errs, fmt.Errorf("ingest: serve: %w", err))
	case err := <-keysDone:
		keysDone <- err
		if err != nil {
			errs = append(errs, err)
		}
	case err := <-s.loginRefused:
		errs = append(errs, err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	// Shutdown closes the listener, then waits for every active request;
	// each is answered once its events are acknowledged or timed out.
	s.conns.stopping.Store(true)
	if err := s.srv.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("ingest: shutdown: %w", err))
	}
	if err := <-serveDone; err != nil && !errors.Is(err, http.ErrServerClosed) && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("ingest: serve: %w", err))
	}
	stopKeys()
	<-balancesDone
	if err := <-keysDone; err != nil && !errors.Is(err, context.Canceled) && len(errs) == 0 {
		errs = append(errs, err)
	}
	s.log.Info("ingest stopped")
	return errors.Join(errs...)
}

// warnOpenFiles warns when MaxConnections does not keep the connections
// below nofile, the process's open-file limit (0: unknown).
func (s *Server) warnOpenFiles(nofile uint64) {
	if m := s.cfg.MaxConnections; nofile > 0 && (m < 0 || uint64(m) >= nofile) {
		s.log.Warn("ingest: --max-connections does not keep the connections below the open-file limit: clients that hold connections open can take every file descriptor, and then new connections, and the Kafka clients', fail; lower it or raise the limit (ulimit -n)",
			zap.Int("max_connections", m), zap.Uint64("open_file_limit", nofile))
	}
}

// warnPlaintext warns when the ingest serves plain HTTP on an address
// that is not loopback (every interface included): the API keys then
// cross the network in the clear, unless the only way in is a proxy
// that terminates TLS, which the ingest cannot tell. The address checked
// is the one bound, so that a name is taken as it resolved.
func (s *Server) warnPlaintext() {
	if s.scheme != "http" {
		return
	}
	if a, ok := s.ln.Addr().(*net.TCPAddr); ok && a.IP.IsLoopback() {
		return
	}
	s.log.Warn("ingest: serving plain HTTP on an address that is not loopback: API keys (Authorization: Bearer) cross the network in the clear; serve HTTPS with --tls-cert-file and --tls-key-file (--ingest-tls-cert-file and --ingest-tls-key-file in meterline run), or let only a proxy that terminates TLS reach the address",
		zap.String("addr", s.cfg.Addr), zap.String("bound", s.Addr()))
}

// producerLogin hands the errors of the producer's connections to
// refusedLogin.
type producerLogin struct{ s *Server }

func (h producerLogin) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		h.s.refusedLogin(err)
	}
}

// refusedLogin stops Run when err, of a connection of the producer, is the
// brokers' refusal of the ingest's SASL user, password or mechanism. The
// producer connects on its own: to a broker that restarted, or after a
// connection the broker closed as idle, it is asked for the password
// again while the reader of the keys topic, on connections of its own,
// may never be (Keys.Follow stops on its refusal). The refused records
// only time out, and the password is read at start only: no retry makes
// it right, and every request would be answered 503 for ever.
func (s *Server) refusedLogin(err error) {
	rerr := s.cfg.Kafka.Refused(err)
	if rerr == nil {
		return
	}
	select {
	case s.loginRefused <- fmt.Errorf("ingest: producer: %w; the password is read at start only: restart the ingest with the current one", rerr):
	default:
	}
}

// initProducerID loads the idempotent producer's ID before the ingest
// serves. The client keeps a refusal of it for good
// (CLUSTER_AUTHORIZATION_FAILED: a principal with Write on no topic),
// where a grant would not heal it: Run stops instead, naming the ACL.
// Once it holds an ID, a Write taken away and granted again heals
// without a restart (the records are refused, then written again). Any
// other error is left to the first request, which loads it again.
func (s *Server) initProducerID(ctx context.Context) error {
	ictx, cancel := context.WithTimeout(ctx, s.cfg.ProduceTimeout)
	defer cancel()
	_, _, err := s.p.Client().ProducerID(ictx)
	if refusedAuth(err) {
		return fmt.Errorf("ingest: producer ID: %w (%s needs Write on topic %s: docs/operations.md, Security and ACLs)", err, s.cfg.Kafka.Principal(), s.cfg.Topic)
	}
	if err != nil {
		s.log.Warn("ingest: cannot load the producer ID yet; the first request loads it", zap.Error(err))
	}
	return nil
}

// close flushes and closes the producer once.
func (s *Server) close() {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ProduceTimeout)
		defer cancel()
		_ = s.p.Flush(ctx)
		s.p.Close()
	})
}

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /api/v1/events", s.endpoint(endpointOpenMeter))
	mux.Handle("POST /v1/events", s.endpoint(endpointMeterline))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		unread(w)
		// 405 only where a POST would be routed to an endpoint: the
		// decoded path alone would take "/api%2Fv1/events", which no
		// route matches, for one (and answer a POST "POST is not
		// allowed").
		if r.Method != http.MethodPost && routesPost(mux, r) {
			w.Header().Set("Allow", "POST")
			writeProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed", fmt.Sprintf("%q is not allowed; POST events", clip(r.Method)), nil, 0)
			s.metrics.observe("", "", http.StatusMethodNotAllowed, "method-not-allowed", 0)
			return
		}
		writeProblem(w, http.StatusNotFound, "not-found", "Not found", "no such endpoint: POST /api/v1/events (CloudEvents) or /v1/events (Meterline JSON)", nil, 0)
		s.metrics.observe("", "", http.StatusNotFound, "not-found", 0)
	})
	// ServeMux redirects a path that is not clean ("//api/v1/events",
	// "/api/v1/./events") to its clean form: a client that follows the
	// redirect as a GET loses the body, and one that does not is left
	// with an answer that is neither a success nor a problem. Such a
	// path is answered 404 instead, naming it.
	// A request without a path (CONNECT host:port) is answered here too:
	// ServeMux would answer it in plain text.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; p == "" || p != cleanPath(p) {
			unread(w)
			detail := "no such endpoint: POST /api/v1/events (CloudEvents) or /v1/events (Meterline JSON)"
			if p != "" {
				detail = fmt.Sprintf("no such endpoint: %q is not a clean path (a double slash, . or ..); POST /api/v1/events (CloudEvents) or /v1/events (Meterline JSON)", clip(p))
			}
			writeProblem(w, http.StatusNotFound, "not-found", "Not found", detail, nil, 0)
			s.metrics.observe("", "", http.StatusNotFound, "not-found", 0)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// routesPost reports whether mux routes r, as a POST, to an endpoint.
func routesPost(mux *http.ServeMux, r *http.Request) bool {
	post := r.WithContext(r.Context())
	post.Method = http.MethodPost
	_, pattern := mux.Handler(post)
	return strings.HasPrefix(pattern, "POST ")
}

// cleanPath is p as ServeMux cleans it before it routes: path.Clean,
// keeping a trailing slash.
func cleanPath(p string) string {
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// endpoint kinds.
const (
	endpointOpenMeter = "openmeter" // POST /api/v1/events
	endpointMeterline = "meterline" // POST /v1/events
)

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// mediaType returns the request's media type, lower case, without
// parameters ("" when it has none or it cannot be parsed), and whether its
// charset, if it names one, is UTF-8.
func mediaType(r *http.Request) (mt string, isUTF8 bool) {
	return parseMediaType(r.Header.Get("Content-Type"))
}

// parseMediaType parses a media type as RFC 9110 has it (the type and
// subtype in any case, then parameters): the type, lower case, ("" when v
// cannot be parsed), and whether its charset, if it names one, is UTF-8:
// the only text JSON may be in (RFC 8259), and the only text this reads.
func parseMediaType(v string) (mt string, isUTF8 bool) {
	mt, params, err := mime.ParseMediaType(v)
	if err != nil {
		return "", false
	}
	cs, ok := params["charset"]
	return mt, !ok || strings.EqualFold(cs, "utf-8")
}

// readBody reads the whole body, at most max bytes, into buf[:0] (a
// buffer for reuse; nil: one is made); tooLarge reports a larger body.
func readBody(buf []byte, w http.ResponseWriter, r *http.Request, max int64) (b []byte, tooLarge bool, err error) {
	if r.ContentLength > max {
		return buf[:0], true, nil
	}
	b, err = readAll(buf, http.MaxBytesReader(w, r.Body, max), r.ContentLength)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return b[:0], true, nil
	}
	return b, false, err
}

// readAll is io.ReadAll into buf[:0], grown first to hold a body of
// sizeHint bytes (the Content-Length; -1 when unknown), so that a body of
// the size it announces is read without growing the buffer again.
func readAll(buf []byte, rd io.Reader, sizeHint int64) ([]byte, error) {
	b := slices.Grow(buf[:0], int(max(min(sizeHint, 64<<20)+1, 512)))
	for {
		n, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
	}
}
