// Package session is the Kafka session of Meterline's exactly-once stages
// — the stream runtime under dedup and the aggregator, and the ClickHouse
// sink: one consumer-group member and one transactional producer in a
// kgo.GroupTransactSession, and the loop that rebuilds that session when a
// commit's outcome is unknown. The connection itself (brokers, SASL, TLS)
// is kafka.Config; the stage decides what its transactions carry.
//
// What a session guarantees, and where (docs/design.md, Exactly-once: "One
// Kafka session", and the numbered items cited below):
//
//   - The transactions of the session commit the consumed offsets with
//     whatever the stage produced in them, or neither (item 1): kgo's
//     GroupTransactSession adds the polled offsets to the transaction, and
//     a revoke marks an open transaction as failed, so it can only abort.
//   - Input is read read_committed, from the group's committed offsets
//     once they are stable (RequireStableFetchOffsets: no transaction of a
//     previous owner still pending, item 3), and never from an automatic
//     offset reset (item 6): the stage's Assigned hook sees every newly
//     assigned partition's committed offset and says where one without an
//     offset starts.
//   - The transactional ID is "<Group>-<InstanceID>", the same in every
//     session of an instance and across restarts, so that a new session
//     fences the old one's producer and aborts or completes its open
//     transaction (item 5).
//   - A session whose commit outcome is unknown ends with ErrRestart; Run
//     then closes it and opens a new one after RestartBackoff, which
//     rejoins the group (item 5); the stage restores on the new
//     assignment (item 3).
package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
)

// ErrRestart is returned by a session's body (Loop.Run), wrapped in a
// RestartError that says why (Restart), when ending a transaction failed
// and its outcome is unknown, or the producer was fenced, lost its
// transactional state or needs its sequence numbers started again: Run
// rebuilds the session with the same transactional ID.
var ErrRestart = errors.New("session: rebuild the session")

// errSessionClosed is what an abandoned session's Assigned hook returns
// (Loop.Close).
var errSessionClosed = errors.New("session: closed")

// RestartReason says why a session was rebuilt: the reason label of
// Names.Restarts. It is one of a fixed set of constants, those below and
// the stage's own (the stream runtime's out_of_order_sequence, …), never
// taken from a record or a broker's answer, so the label stays bounded.
type RestartReason string

// The reasons of every stage.
const (
	// RestartCommitUnknown: ending a transaction failed, its outcome
	// unknown (EndFailed).
	RestartCommitUnknown RestartReason = "commit_unknown"
	// RestartFenced: the producer was fenced (Fenced): another producer
	// initialised the transactional ID since, or the coordinator aborted
	// a transaction that outlasted the transaction timeout.
	RestartFenced RestartReason = "fenced"
	// RestartInitProducerID: initialising the transactional ID of a new
	// session failed (Loop.InitProducerID).
	RestartInitProducerID RestartReason = "init_producer_id"
	// RestartOther: ErrRestart without a RestartError, which no stage
	// returns: a defect. Not exported until it happens.
	RestartOther RestartReason = "other"
)

// RestartError is ErrRestart with why the session is rebuilt.
type RestartError struct {
	// Reason is what Run counts the rebuild under.
	Reason RestartReason
	// Err is the cause (the error that ended the transaction, or the
	// record's), or nil.
	Err error
}

func (e *RestartError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%v (%s)", ErrRestart, e.Reason)
	}
	return fmt.Sprintf("%v (%s): %v", ErrRestart, e.Reason, e.Err)
}

// Unwrap returns ErrRestart and the cause.
func (e *RestartError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrRestart}
	}
	return []error{ErrRestart, e.Err}
}

// Restart returns ErrRestart for reason, with its cause (nil: none but
// the reason).
func Restart(reason RestartReason, cause error) error {
	return &RestartError{Reason: reason, Err: cause}
}

// EndFailed returns ErrRestart for a transaction whose end failed with
// err: fenced if the producer was fenced (Fenced), else commit_unknown.
func EndFailed(err error) error {
	if Fenced(err) {
		return Restart(RestartFenced, err)
	}
	return Restart(RestartCommitUnknown, err)
}

// restartReason returns the reason of err, an ErrRestart.
func restartReason(err error) RestartReason {
	if re, ok := errors.AsType[*RestartError](err); ok {
		return re.Reason
	}
	return RestartOther
}

// Fenced reports whether err says that the session's producer was fenced:
// another producer with its transactional ID initialised it since (its
// epoch is newer), or the coordinator aborted a transaction that outlasted
// the transaction timeout.
func Fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// Repeated fencing: a producer fenced fenceHintAfter times within
// fenceWindow is most likely fenced by another process with the same
// transactional ID (two instances started with one --instance-id): each
// session's start fences the other's. Run then says so, at most once per
// fenceHintEvery.
const (
	fenceHintAfter = 3
	fenceWindow    = 10 * time.Minute
	fenceHintEvery = time.Minute
)

// LeaveTimeout bounds how long Close waits for the group's coordinator to
// answer the session's LeaveGroup.
const LeaveTimeout = 5 * time.Second

// CloseTimeout bounds how long Close waits, after the LeaveGroup, for the
// session's client to close.
const CloseTimeout = 3 * time.Second

// Close closes sess. It leaves the group first, waiting at most
// LeaveTimeout for the coordinator: kgo's Close waits for the LeaveGroup
// without a bound and retries it, so a stage told to stop while a broker
// hangs (or drops its packets) would outlast any grace period before
// SIGKILL. A member whose leave was not heard is dropped from the group at
// its session timeout, as a killed one. It then waits at most CloseTimeout
// for kgo's Close, which waits for the group's requests in flight: a
// JoinGroup or a dial to a coordinator that is paused (SIGSTOP, a hung
// JVM: its port accepts connections, and neither TLS nor any request is
// ever answered) holds it for the dial timeout (kafka.DialTimeout, 3 s)
// or kgo's request timeout overhead (10 s), again and again, while the
// session cannot be rebuilt (docs/operations.md, "One broker paused or killed"). A client
// still closing then is abandoned: it ends once those requests time out,
// it no longer calls the stage's hooks, and a new session with the same
// transactional ID fences its producer.
func (l *Loop) Close(sess *kgo.GroupTransactSession) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), LeaveTimeout)
	_ = sess.Client().LeaveGroupContext(ctx)
	cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sess.Close()
	}()
	select {
	case <-done:
	case <-time.After(CloseTimeout):
		l.log.Warn("the Kafka session's client is still closing (a broker that does not answer); abandoned, it closes in the background",
			zap.Duration("waited", time.Since(start)))
	}
	l.gatesMu.Lock()
	g := l.gates[sess]
	delete(l.gates, sess)
	l.gatesMu.Unlock()
	if g != nil {
		g.close()
	}
}

// hookGate passes a session's hooks on to the stage until the session is
// closed (Loop.Close): an abandoned client that calls them late must not
// touch the next session's partitions.
type hookGate struct {
	mu     sync.RWMutex
	closed bool
}

// do runs f unless the gate is closed; close waits for an f that runs.
func (g *hookGate) do(f func()) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if !g.closed {
		f()
	}
}

func (g *hookGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Loop opens a stage instance's sessions, one at a time, and runs them
// until the stage stops (Run).
type Loop struct {
	cfg      Config
	conn     []kgo.Opt // cfg.Kafka's seed brokers, SASL and TLS
	log      *zap.Logger
	m        *Metrics
	recovery string
	// notMember is why the open session is not a member of its consumer
	// group; nil while it is (InGroup).
	notMember atomic.Pointer[string]
	// fences are the times of the restarts after a fenced producer in
	// the last fenceWindow, and fenceHinted when Run last said what
	// repeated fencing likely means (Run's goroutine only).
	fences      []time.Time
	fenceHinted time.Time
	// gates are the hook gates of the sessions not closed yet (Close).
	gatesMu sync.Mutex
	gates   map[*kgo.GroupTransactSession]*hookGate
	// seedsBack are the seeds the open session's client takes back once
	// its transactional ID is initialised (startConn; the goroutine that
	// opens sessions only).
	seedsBack []string
}

// NewLoop returns the loop of one stage instance. cfg must have its
// defaults (EnsureDefaults) and be valid. The restart log lines go to log
// and say what the stage does after a new session joined (recovery, e.g.
// "then restoring"); kgo's own lines go to log too, named "kgo", at warn
// and above unless log is at debug level. m counts the loop's
// transactions and restarts.
func NewLoop(cfg Config, log *zap.Logger, m *Metrics, recovery string) (*Loop, error) {
	conn, err := cfg.Kafka.Opts()
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	l := &Loop{cfg: cfg, conn: conn, log: log, m: m, recovery: recovery, gates: map[*kgo.GroupTransactSession]*hookGate{}}
	l.setNotMember("no session open")
	return l, nil
}

// InGroup returns nil while the open session is a member of its consumer
// group: kgo has assigned it its partitions (none, with more members than
// partitions) and not lost them since; otherwise why not. The group is
// lost when kgo cannot reach it for its session (the brokers down or
// unreachable, the coordinator gone): kgo then drops the assignment (the
// Revoked hook) and rejoins, and the stage has nothing to process until it
// is back. Dedup, the aggregator and the sink are not ready meanwhile
// (docs/operations.md, Health, metrics and logs).
func (l *Loop) InGroup() error {
	if why := l.notMember.Load(); why != nil {
		return fmt.Errorf("not in consumer group %s: %s", l.cfg.Group, *why)
	}
	return nil
}

func (l *Loop) setNotMember(why string) {
	l.notMember.Store(&why)
	l.m.Member.Set(0)
}

func (l *Loop) setMember() {
	l.notMember.Store(nil)
	l.m.Member.Set(1)
}

// Conn returns the client options of the connection (seed brokers, SASL,
// TLS), for the stage's other clients.
func (l *Loop) Conn() []kgo.Opt { return slices.Clone(l.conn) }

// Hooks are the stage's side of a session's group membership. Both run on
// kgo's group goroutine and are required.
type Hooks struct {
	// Assigned is kgo's AdjustFetchOffsetsFn: it runs once the group's
	// committed offsets of newly assigned partitions are fetched and
	// stable, and returns where each partition starts. A partition without
	// a committed offset comes with kgo.NoResetOffset, which means its end:
	// the stage sets where it starts.
	Assigned func(context.Context, map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error)
	// Revoked is called for partitions revoked and for partitions lost. It
	// must finish or abandon the stage's work on them before it returns.
	Revoked func(context.Context, *kgo.Client, map[string][]int32)
}

// Open returns a new session consuming topics: the connection's options,
// then the group and transaction settings of the Config, the hooks, the
// stage's opts, and last Config.ClientOptions. Close it with Loop.Close,
// which leaves the group; the hooks are not called after it returned.
func (l *Loop) Open(topics []string, h Hooks, opts ...kgo.Opt) (*kgo.GroupTransactSession, error) {
	c := &l.cfg
	g := &hookGate{}
	base := []kgo.Opt{
		kgo.TransactionalID(c.TransactionalID()),
		kgo.TransactionTimeout(c.TransactionTimeout),
		kgo.ConsumerGroup(c.Group),
		kgo.ConsumeTopics(topics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		// No automatic reset: an out-of-range offset (retention deleted
		// records the stage never read) is an error, never a silent jump
		// (docs/design.md, Exactly-once, 6). Assigned sets where a first
		// start reads from.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.RebalanceTimeout(c.RebalanceTimeout),
		kgo.HeartbeatInterval(c.SessionTimeout / 10),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.ProducerLinger(0),
		kgo.AdjustFetchOffsetsFn(func(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			out, err := offs, error(errSessionClosed)
			g.do(func() { out, err = h.Assigned(ctx, offs) })
			return out, err
		}),
		// kgo calls OnPartitionsAssigned after every join of the group,
		// with nothing assigned too, and OnPartitionsLost when it lost the
		// group (InGroup).
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { g.do(l.setMember) }),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
			g.do(func() { h.Revoked(ctx, cl, revoked) })
		}),
		kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
			g.do(func() {
				l.setNotMember("lost the group or its coordinator (brokers unreachable?); rejoining")
				h.Revoked(ctx, cl, lost)
			})
		}),
		kgo.WithLogger(kzap.New(l.log.Named("kgo"), kzap.Level(kgoLevel(l.log)))),
	}
	l.setNotMember("joining")
	sess, err := kgo.NewGroupTransactSession(slices.Concat(l.startConn(), base, opts, c.ClientOptions)...)
	if err != nil {
		return nil, fmt.Errorf("session: kafka client for group %s: %w", c.Group, err)
	}
	l.gatesMu.Lock()
	l.gates[sess] = g
	l.gatesMu.Unlock()
	return sess, nil
}

// startConn returns the connection options of a new session's client:
// the connection's, seeded with the brokers the cluster lists now
// (kafka.ListedSeeds) when a seed answers within kafka.ListedBrokerWait.
// A new client knows no broker but its seeds, and sends its first
// requests that may go to any broker (the FindCoordinator of
// InitProducerID, the group's first metadata) to them in turn: a seed
// that is paused or cut off holds each such request for the dial timeout
// (over TLS) or kgo's request timeout overhead (in plaintext, 10 s),
// twice (kgo opens a failed connection once more), and a new session
// that started from it could spend InitProducerID's whole bound there and
// be rebuilt, again and again until that broker was back
// (docs/operations.md, "One broker paused or killed"). The cluster lists
// only the brokers that serve once it has fenced such a broker (9 s).
// InitProducerID gives the client the connection's seeds back, its way
// back to a cluster whose brokers all changed address, but only those the
// cluster listed (all of them when it listed none of them, as when they
// name a load balancer): a seed the cluster did not list would still be
// picked now and then by the session's requests that may go to any
// broker, most often at its start, and hold each for those seconds. The
// next session asks again.
func (l *Loop) startConn() []kgo.Opt {
	l.seedsBack = l.cfg.Kafka.Brokers
	listed := kafka.ListedSeeds(context.Background(), l.cfg.Kafka)
	if len(listed) == 0 {
		l.log.Info("no seed broker listed the cluster's brokers in time; the session starts from the seeds",
			zap.Strings("seeds", l.cfg.Kafka.Brokers), zap.Duration("wait", kafka.ListedBrokerWait))
		return l.conn
	}
	var back []string
	for _, b := range l.cfg.Kafka.Brokers {
		if slices.Contains(listed, b) {
			back = append(back, b)
		}
	}
	if len(back) > 0 {
		l.seedsBack = back
	}
	return append(slices.Clone(l.conn), kgo.SeedBrokers(listed...))
}

// InitProducerID initialises the session's transactional ID now, not at
// its first transaction: it fences a previous incarnation of the instance
// and aborts (or completes) its open transaction (docs/design.md,
// Exactly-once, 5), and a principal without Write on the transactional ID
// is refused at start, not at the first transaction, which an idle stage
// may reach only hours later. A failure returns ErrRestart, so Run
// rebuilds the session, but a missing ACL is an error naming the ID and
// the ACL (Config.TransactionalIDError): no retry grants it; nor does one
// make a refused user or password right (kafka.Config.Refused). Once
// initialised, the client's seeds are the connection's again, those the
// cluster listed when the session opened (startConn).
func (l *Loop) InitProducerID(ctx context.Context, cl *kgo.Client) error {
	ictx, cancel := context.WithTimeout(ctx, l.cfg.TransactionTimeout+l.cfg.SessionTimeout)
	_, _, perr := cl.ProducerID(ictx)
	cancel()
	switch {
	case perr == nil:
		// The client knows the brokers now; the seeds it started from
		// give way to the connection's the cluster listed (startConn).
		if err := cl.UpdateSeedBrokers(l.seedsBack...); err != nil {
			return fmt.Errorf("session: %w", err)
		}
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(perr, kerr.TransactionalIDAuthorizationFailed):
		return fmt.Errorf("initialise %w", l.cfg.TransactionalIDError(perr))
	}
	// Credentials the brokers accepted at start and refuse now (a
	// password changed on the cluster): the stage stops as it would at
	// start, since it reads its password at start only.
	if rerr := l.cfg.Kafka.Refused(perr); rerr != nil {
		return fmt.Errorf("session: %w; the password is read at start only: restart the stage with the current one", rerr)
	}
	l.log.Warn("initialising the transactional ID failed; retrying", zap.Error(perr))
	return Restart(RestartInitProducerID, perr)
}

// kgoLevel logs kgo's own messages at warn and above, unless the stage's
// logger is at debug level.
func kgoLevel(l *zap.Logger) kgo.LogLevel {
	if l.Core().Enabled(zap.DebugLevel) {
		return kgo.LogLevelDebug
	}
	return kgo.LogLevelWarn
}

// Run calls body, which opens one session, runs it and closes it, until
// ctx ends or body returns an error other than ErrRestart. After
// ErrRestart it counts a restart under its reason (RestartError), logs it
// and calls body again after RestartBackoff. It returns nil when ctx has ended and body returned nil,
// a context.Canceled or ErrRestart (stopping is not a failure), and
// body's error otherwise.
func (l *Loop) Run(ctx context.Context, body func(context.Context) error) error {
	for {
		err := body(ctx)
		if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrRestart)) {
			return nil
		}
		if !errors.Is(err, ErrRestart) {
			return err
		}
		reason := restartReason(err)
		l.m.Restarts.WithLabelValues(string(reason)).Inc()
		l.log.Warn("rebuilding the Kafka session with the same transactional ID (which aborts or completes the open transaction), "+l.recovery,
			zap.String("transactional_id", l.cfg.TransactionalID()), zap.String("reason", string(reason)), zap.Error(err))
		if reason == RestartFenced {
			l.fenced(time.Now())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(l.cfg.RestartBackoff):
		}
	}
}

// fenced counts a restart after a fenced producer at now and, from the
// fenceHintAfter-th within fenceWindow, logs what repeated fencing likely
// means (docs/operations.md, MeterlineSessionRestarts).
func (l *Loop) fenced(now time.Time) {
	l.fences = append(l.fences, now)
	for len(l.fences) > 0 && now.Sub(l.fences[0]) > fenceWindow {
		l.fences = l.fences[1:]
	}
	if len(l.fences) < fenceHintAfter || (!l.fenceHinted.IsZero() && now.Sub(l.fenceHinted) < fenceHintEvery) {
		return
	}
	l.fenceHinted = now
	l.log.Error("the producer was fenced again and again: another process is most likely running with the same --group and "+
		"--instance-id (the same transactional ID), and each one's new session fences the other's; give every instance its own "+
		"--instance-id (rarer fencing: transactions outlasting --transaction-timeout)",
		zap.String("transactional_id", l.cfg.TransactionalID()), zap.String("instance_id", l.cfg.InstanceID),
		zap.Int("fenced", len(l.fences)), zap.Duration("within", fenceWindow))
}

// FetchError returns the first error of a poll's fetches that stops the
// stage, or nil. Not errors: a poll cut short (Interrupted), and a group
// session error that kgo repairs by rejoining (kafka.GroupRejoins): the
// member was dropped from the group (a zombie after a long pause, a missed
// session timeout) or could not reach the group coordinator (a broker that
// died or paused, a coordinator that moved). kgo injects that one after it
// has already called the Revoked hook for every partition the member owned
// (an open transaction can only abort) and keeps rejoining; the next
// assignment restores or resumes as usual. It is logged at warn level.
// Any other error, such as an authorization failure or an offset out of
// range, stops the stage: offsets are never reset automatically
// (docs/design.md, Exactly-once, 6). An authorization failure names the
// ACL the principal lacks: Read on the topic, or on group; a refused SASL
// login wraps kafka.ErrAuthentication.
func FetchError(log *zap.Logger, principal, group string, fs kgo.Fetches) error {
	var ferr error
	fs.EachError(func(t string, p int32, err error) {
		if Interrupted(err) {
			return
		}
		var gs *kgo.ErrGroupSession
		if errors.As(err, &gs) && kafka.GroupRejoins(gs.Err) {
			log.Warn("lost the consumer group or its coordinator; rejoining", zap.Error(err))
			return
		}
		if ferr != nil {
			return
		}
		switch {
		case errors.As(err, &gs) && errors.Is(err, kerr.GroupAuthorizationFailed):
			ferr = fmt.Errorf("consumer group %s: %w (%s needs Read on group %s: docs/operations.md, Security and ACLs)", group, err, principal, group)
		case errors.Is(err, kerr.TopicAuthorizationFailed):
			where := fmt.Sprintf("%s/%d", t, p)
			if p < 0 { // the topic's error, not a partition's
				where = t
			}
			ferr = fmt.Errorf("fetch %s: %w (%s needs Read on topic %s: docs/operations.md, Security and ACLs)", where, err, principal, t)
		case kafka.SASLRefused(err):
			// Accepted at start, refused now (a password changed on the
			// cluster): no retry makes the stage's password right.
			ferr = fmt.Errorf("%w: the brokers refuse the stage's SASL user, password or mechanism: %v (the password is read at start only: restart the stage with the current one)",
				kafka.ErrAuthentication, err)
		default:
			ferr = fmt.Errorf("fetch %s/%d: %w (offsets are never reset automatically; see docs/design.md, Exactly-once, point 6)", t, p, err)
		}
	})
	return ferr
}

// Interrupted reports whether a fetch error only says that the poll was
// cut short (its context ended, or the client closed): nothing failed.
func Interrupted(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed)
}
