package ingest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/schemas"
)

// Keys holds the API keys and tenants of the keys topic, following it.
// It is safe for concurrent use.
type Keys struct {
	topic string
	log   *zap.Logger
	// fatal names the fetch and listing errors that end Follow; any
	// other is logged and the read goes on.
	fatal func(error) bool

	mu      sync.RWMutex
	keys    map[string]*Key
	tenants map[string]*Tenant
	bad     int // records that could not be read
	// restarts counts the times the topic was found made again (restart).
	restarts int
	loaded   chan struct{}
	once     sync.Once

	// maxAge bounds the age of the keys (Staleness); ≤ 0: no bound.
	maxAge time.Duration
	// probe is how often Follow lists the topic's ends to confirm it has
	// read them (keysProbe; a quarter of maxAge when that is less).
	probe time.Duration
	clock func() time.Time
	// fresh guards confirmed and stale.
	fresh sync.Mutex
	// confirmed is when the topic's ends were last listed that the read
	// has since reached: every record acknowledged before it is applied.
	// Before the first, when the set was made.
	confirmed time.Time
	stale     bool // the age was past maxAge when last looked at
}

// keysProbe is how often a replica lists the keys topic's ends to
// confirm it has read them (Keys.Staleness): one ListOffsets request per
// replica every 5 s, and a replica serves again at most 5 s after the
// topic answers.
const keysProbe = 5 * time.Second

// NewKeys returns an empty key set for topic; Follow fills it.
func NewKeys(topic string, log *zap.Logger) *Keys {
	if log == nil {
		log = zap.NewNop()
	}
	return &Keys{topic: topic, log: log, keys: map[string]*Key{}, tenants: map[string]*Tenant{}, loaded: make(chan struct{}),
		fatal: keysFatal, probe: keysProbe, clock: time.Now, confirmed: time.Now()}
}

// SetMaxAge bounds the age of the keys (Staleness); ≤ 0: no bound. Call
// before Follow.
func (k *Keys) SetMaxAge(d time.Duration) {
	k.maxAge = d
	k.probe = keysProbe
	if d > 0 && d/4 < k.probe {
		// At least a millisecond: a ticker of no interval panics, and
		// an age that small leaves the keys stale anyway.
		k.probe = max(d/4, time.Millisecond)
	}
}

// confirm records that the read reached the ends the topic had at at:
// every key revoked before at is refused.
func (k *Keys) confirm(at time.Time) {
	k.markLoaded()
	k.fresh.Lock()
	defer k.fresh.Unlock()
	if at.After(k.confirmed) {
		k.confirmed = at
	}
	if k.stale && k.maxAge > 0 && k.clock().Sub(k.confirmed) <= k.maxAge {
		k.stale = false
		k.log.Info("keys topic read to its end again: serving", zap.String("topic", k.topic))
	}
}

// Staleness returns the age of the keys: the time since the topic's
// ends were last listed that the read has since reached (before the
// first, since the set was made). Stale reports it past the bound
// (SetMaxAge) on a loaded set: a key revoked since may not be known here.
// The first look that finds the set stale logs it.
func (k *Keys) Staleness() (age time.Duration, stale bool) {
	k.fresh.Lock()
	defer k.fresh.Unlock()
	age = k.clock().Sub(k.confirmed)
	select {
	case <-k.loaded:
	default:
		return age, false
	}
	stale = k.maxAge > 0 && age > k.maxAge
	if stale && !k.stale {
		k.log.Error("keys topic not confirmed read to its end within the bound: every request is answered 503 until it is (--auth-max-age)",
			zap.String("topic", k.topic), zap.Duration("age", age), zap.Duration("max_age", k.maxAge))
	}
	k.stale = stale
	return age, stale
}

// refusedRead reports a fetch refused for want of Read on the topic. It
// ends a read of the keys topic: a principal refused it will not read a
// revocation either, and an ingest that went on with the keys it holds
// would accept a revoked key for ever.
func refusedRead(err error) bool { return errors.Is(err, kerr.TopicAuthorizationFailed) }

// keysFatal names the errors that end a read of the keys topic: a refused
// Read (refusedRead), and a refused SASL login, which no retry makes
// right, as the password is read at start only; an ingest that went on
// would answer every request 503 for ever.
func keysFatal(err error) bool { return refusedRead(err) || kafka.SASLRefused(err) }

// Loaded is closed once the set holds every record the topic had when
// Follow started.
func (k *Keys) Loaded() <-chan struct{} { return k.loaded }

// ErrNoKeysTopic is returned by Follow when the keys topic does not exist.
var ErrNoKeysTopic = errors.New("keys topic does not exist")

// Follow reads the keys topic from its start with the client's brokers
// and applies each record, until ctx ends. opts are added to the client
// (TLS, SASL). Loaded is closed once the records present at the start are
// applied. A record that cannot be read is logged and counted; the key
// or tenant its record key names is then forgotten (refused), as it is by
// a replica that starts once compaction left only that record. Every
// probe interval it lists the topic's ends again, which the read must
// reach to confirm the keys current (Staleness).
func (k *Keys) Follow(ctx context.Context, opts ...kgo.Opt) error {
	if k.maxAge > 0 {
		// The turn to stale is logged when it happens, requests or not.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go every(wctx, k.probe, func() { k.Staleness() })
	}
	err := tail(ctx, k.topic, "keys", k.log, opts, func(r *kgo.Record) { k.apply(string(r.Key), r.Value) }, k.confirm, k.probe, k.fatal)
	for errors.Is(err, errTopicRestarted) {
		k.restart(err)
		err = tail(ctx, k.topic, "keys", k.log, opts, func(r *kgo.Record) { k.apply(string(r.Key), r.Value) }, k.confirm, k.probe, k.fatal)
	}
	if errors.Is(err, errNoTopic) {
		return fmt.Errorf("ingest: %w: %s (run `meterline topics create`)", ErrNoKeysTopic, k.topic)
	}
	if refusedRead(err) {
		return fmt.Errorf("%w: the principal needs Read on the keys topic %s (docs/operations.md, ACLs)", err, k.topic)
	}
	if kafka.SASLRefused(err) {
		return fmt.Errorf("%w: the brokers refuse the ingest's SASL user, password or mechanism: %w (the password is read at start only: restart the ingest with the current one)",
			kafka.ErrAuthentication, err)
	}
	return err
}

// restart drops every key and tenant read from a keys topic that was
// deleted and made again (errTopicRestarted), before the new one is read
// from its start: a key of the old topic is refused from then on, as it
// is by a replica that starts then.
func (k *Keys) restart(cause error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.log.Error("keys topic deleted and made again (or its partition went back): dropping the keys and tenants read from it and reading it again from its start",
		zap.String("topic", k.topic), zap.Int("keys", len(k.keys)), zap.Int("tenants", len(k.tenants)), zap.Error(cause))
	k.keys, k.tenants = map[string]*Key{}, map[string]*Tenant{}
	k.restarts++
}

// errNoTopic is returned by tail when its topic does not exist.
var errNoTopic = errors.New("topic does not exist")

// errTopicRestarted is returned by tail when a listing finds its topic
// made again: another topic ID, or a partition's end before the offset
// read.
var errTopicRestarted = errors.New("topic deleted and made again")

// tail reads every partition of topic from its start with a client of
// opts and gives each record to apply, in offset order per partition,
// until ctx ends (then it returns nil). reached(at) is called each time
// the read has reached the ends the topic had at at: first for those it
// had as tail started (at once for an empty topic), then, every probe
// (when probe > 0), for a new listing of its ends; a listing that finds
// the topic made again (another topic ID, or a partition ending before
// the offset read) ends the read with an error wrapping
// errTopicRestarted. A listing that fails
// (the partition's leader offline or out of reach) is not reached: the
// last at then ages. what names the topic in errors and logs. It
// returns an error wrapping errNoTopic when the topic does not exist. A
// fetch error is logged and the read goes on, unless fatal (when not nil)
// says it ends the read: tail then returns it, as it does a listing's
// error that fatal names.
// The keys and the balances of the ingest are followed this way.
func tail(ctx context.Context, topic, what string, log *zap.Logger, opts []kgo.Opt, apply func(*kgo.Record), reached func(at time.Time),
	probe time.Duration, fatal func(error) bool) error {
	// Read committed: a balance of an aborted transaction is never
	// applied. Control records are kept, so that a partition whose last
	// offset is a transaction's marker is seen caught up; they are not
	// applied.
	cl, err := kgo.NewClient(append(slices.Clone(opts), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Second),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())...)
	if err != nil {
		return fmt.Errorf("ingest: %s client: %w", what, err)
	}
	defer cl.Close()
	marks := &readMarks{next: map[int32]int64{}, reached: reached}
	at := time.Now()
	ends, err := listEnds(ctx, cl, topic)
	if err != nil {
		if strings.Contains(err.Error(), "UNKNOWN_TOPIC_OR_PARTITION") {
			return fmt.Errorf("ingest: %s topic %s: %w", what, topic, errNoTopic)
		}
		return fmt.Errorf("ingest: %s topic %s: end offsets: %w", what, topic, err)
	}
	marks.add(ends, at)
	id := topicID(ctx, cl, topic)
	// A listing of the ends that fails as fatal says ends the read: the
	// poll is cut short with it as the cause.
	rctx, refused := context.WithCancelCause(ctx)
	defer refused(nil)
	if probe > 0 {
		pctx, stop := context.WithCancel(rctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			probeEnds(pctx, cl, topic, id, what, log, probe, marks, func(err error) {
				if errors.Is(err, errTopicRestarted) || fatal != nil && fatal(err) {
					refused(err)
				}
			})
		}()
		defer wg.Wait()
		defer stop()
	}
	for {
		fs := cl.PollFetches(rctx)
		if err := ctx.Err(); err != nil {
			return nil
		}
		if rctx.Err() != nil {
			return fmt.Errorf("ingest: %s topic %s: end offsets: %w", what, topic, context.Cause(rctx))
		}
		var end error
		fs.EachError(func(t string, p int32, err error) {
			if fatal != nil && fatal(err) {
				end = fmt.Errorf("ingest: reading the %s topic %s: %w", what, t, err)
				return
			}
			log.Warn("reading the "+what+" topic", zap.String("topic", t), zap.Int32("partition", p), zap.Error(err))
		})
		if end != nil {
			return end
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				apply(r)
			}
			marks.read(r.Partition, r.Offset)
		})
	}
}

// listEnds lists the ends of topic's partitions as a read-committed
// consumer sees them (the last stable offsets).
func listEnds(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	listed, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return nil, err
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	return ends, nil
}

// probeEnds lists topic's ends every interval until ctx ends, each
// listing a mark for the read to reach. A listing gets as long as the
// interval twice; one that fails is logged at debug (the age of the last
// mark reached tells of it) and given to failed.
func probeEnds(ctx context.Context, cl *kgo.Client, topic string, id kadm.TopicID, what string, log *zap.Logger, interval time.Duration, marks *readMarks,
	failed func(error)) {
	every(ctx, interval, func() {
		at := time.Now()
		// The offsets read before the listing: a partition of the same
		// topic ends at or after them.
		read := marks.snapshot()
		lctx, cancel := context.WithTimeout(ctx, 2*interval)
		ends, err := listEnds(lctx, cl, topic)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Debug("listing the ends of the "+what+" topic", zap.String("topic", topic), zap.Error(err))
				failed(err)
			}
			return
		}
		if err := restarted(ends, read, id, topicID(ctx, cl, topic)); err != nil {
			failed(err)
			return
		}
		marks.add(ends, at)
	})
}

// topicID returns the ID of topic, or zero when it cannot be listed.
func topicID(ctx context.Context, cl *kgo.Client, topic string) kadm.TopicID {
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil || td[topic].Err != nil {
		return kadm.TopicID{}
	}
	return td[topic].ID
}

// restarted returns an error wrapping errTopicRestarted when the topic
// listed is another than the one read: its ID (when both are known) is
// not the one it had, or a partition ends before the offsets read before
// the listing (read).
func restarted(ends, read map[int32]int64, was, now kadm.TopicID) error {
	if was != (kadm.TopicID{}) && now != (kadm.TopicID{}) && was != now {
		return fmt.Errorf("%w: topic ID %s, was %s", errTopicRestarted, now, was)
	}
	for p, end := range ends {
		if end < read[p] {
			return fmt.Errorf("%w: partition %d ends at %d, before offset %d read", errTopicRestarted, p, end, read[p])
		}
	}
	return nil
}

// snapshot returns the offsets read so far, per partition.
func (m *readMarks) snapshot() map[int32]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.next)
}

// every calls fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// readMarks is how far a read has got in each partition, and the
// listings of the topic's ends it has yet to reach, oldest first.
type readMarks struct {
	mu      sync.Mutex
	next    map[int32]int64 // per partition, the offset after the last record read
	pending []readMark
	reached func(at time.Time)
}

// maxReadMarks bounds the listings a read has yet to reach.
const maxReadMarks = 64

// readMark is a listing of the topic's ends, made at at.
type readMark struct {
	ends map[int32]int64
	at   time.Time
}

func (m *readMarks) add(ends map[int32]int64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// A read that does not move while the listings succeed keeps its
	// oldest marks and the newest.
	if len(m.pending) >= maxReadMarks {
		m.pending = m.pending[:maxReadMarks-1]
	}
	m.pending = append(m.pending, readMark{ends: ends, at: at})
	m.check()
}

func (m *readMarks) read(partition int32, offset int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if offset+1 > m.next[partition] {
		m.next[partition] = offset + 1
	}
	if len(m.pending) > 0 {
		m.check()
	}
}

// check calls reached with the newest listing the read has reached, and
// drops it and those before. m.mu is held.
func (m *readMarks) check() {
	var at time.Time
	n := 0
	for n < len(m.pending) && m.covers(m.pending[n].ends) {
		at = m.pending[n].at
		n++
	}
	if n > 0 {
		m.pending = m.pending[n:]
		m.reached(at)
	}
}

func (m *readMarks) covers(ends map[int32]int64) bool {
	for p, end := range ends {
		if m.next[p] < end {
			return false
		}
	}
	return true
}

func (k *Keys) markLoaded() { k.once.Do(func() { close(k.loaded) }) }

// apply applies one record of the keys topic.
func (k *Keys) apply(key string, value []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if value == nil { // a tombstone
		k.forget(key)
		return
	}
	r, err := decodeRecord(key, value)
	if err != nil {
		// The last record of a key in the compacted topic is what the key
		// is: one that cannot be read (a revocation by a newer Meterline, a
		// damaged value) leaves it refused, never in the state of the
		// record before, which a replica starting after compaction would
		// not have seen either.
		k.bad++
		k.forget(key)
		k.log.Error("unreadable record in the keys topic; the key or tenant it names is refused until a readable record replaces it",
			zap.String("record", key), zap.Error(err))
		return
	}
	if r.Key != nil {
		k.keys[r.Key.ID] = r.Key
	}
	if r.Tenant != nil {
		k.tenants[r.Tenant.Name] = r.Tenant
	}
}

// forget drops the key or tenant that a record key names. k.mu is held.
func (k *Keys) forget(key string) {
	if id, ok := strings.CutPrefix(key, "key/"); ok {
		delete(k.keys, id)
	} else if name, ok := strings.CutPrefix(key, "tenant/"); ok {
		delete(k.tenants, name)
	}
}

// Authenticate returns the active key the bearer token belongs to, and its
// tenant (nil when the tenant does not exist); nil when the token is no
// active key's.
func (k *Keys) Authenticate(token string) (*Key, *Tenant) {
	id := tokenID(token)
	if id == "" {
		return nil, nil
	}
	k.mu.RLock()
	key := k.keys[id]
	var t *Tenant
	if key != nil {
		t = k.tenants[key.Tenant]
	}
	k.mu.RUnlock()
	if key == nil || !key.matches(token) || !key.Active() {
		return nil, nil
	}
	return key, t
}

// Snapshot returns the keys, sorted by tenant and creation, and the
// tenants, sorted by name.
func (k *Keys) Snapshot() ([]Key, []Tenant) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	keys := make([]Key, 0, len(k.keys))
	for _, v := range k.keys {
		keys = append(keys, *v)
	}
	ts := make([]Tenant, 0, len(k.tenants))
	for _, v := range k.tenants {
		ts = append(ts, *v)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Tenant != keys[j].Tenant {
			return keys[i].Tenant < keys[j].Tenant
		}
		if !keys[i].Created.Equal(keys[j].Created) {
			return keys[i].Created.Before(keys[j].Created)
		}
		return keys[i].ID < keys[j].ID
	})
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return keys, ts
}

// Admin writes keys and tenants to the keys topic. Each write returns once
// the brokers acknowledged it (acks=all).
type Admin struct {
	cl    *kgo.Client
	topic string
	now   func() time.Time
}

// NewAdmin returns an Admin writing to topic with the client, which must
// use acks=all (kgo's default).
func NewAdmin(cl *kgo.Client, topic string) *Admin {
	return &Admin{cl: cl, topic: topic, now: time.Now}
}

// load reads the whole keys topic, with a client of the same options as
// the Admin's.
func (a *Admin) load(ctx context.Context) (*Keys, error) {
	opts := a.cl.Opts()
	k := NewKeys(a.topic, nil)
	// A command ends at once on a refusal rather than at its deadline:
	// a principal without Read on the topic (the operator's) never will.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- k.Follow(ctx, opts...) }()
	select {
	case <-k.Loaded():
		return k, nil
	case err := <-errc:
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
}

// List returns the keys and tenants of the topic.
func (a *Admin) List(ctx context.Context) ([]Key, []Tenant, error) {
	k, err := a.load(ctx)
	if err != nil {
		return nil, nil, err
	}
	keys, ts := k.Snapshot()
	return keys, ts, nil
}

func (a *Admin) write(ctx context.Context, key string, r record) error {
	rec := &kgo.Record{Topic: a.topic, Key: []byte(key), Value: encodeRecord(r)}
	err := a.cl.ProduceSync(ctx, rec).FirstErr()
	if errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
		// CLUSTER_AUTHORIZATION_FAILED: the idempotent producer's
		// InitProducerID, which a principal may send once it has Write on
		// some topic.
		return fmt.Errorf("ingest: write %s to %s: %w (the principal needs Write on topic %s: docs/operations.md, Security and ACLs)", key, a.topic, err, a.topic)
	}
	if err != nil {
		return fmt.Errorf("ingest: write %s to %s: %w", key, a.topic, err)
	}
	return nil
}

// SetTenant makes or replaces a tenant. Its keys keep their own customer
// lists, but write only customers the tenant still has.
func (a *Admin) SetTenant(ctx context.Context, name string, customers []string) (Tenant, error) {
	if err := errors.Join(checkTenant(name), CheckPatterns("customers", customers)); err != nil {
		return Tenant{}, err
	}
	t := Tenant{Name: name, Customers: customers, Updated: a.now().UTC()}
	return t, a.write(ctx, tenantRecordKey(name), record{Tenant: &t})
}

// KeySpec is what CreateKey makes.
type KeySpec struct {
	Tenant string
	// Customers the key may write; empty: all of the tenant's. Each must
	// be within the tenant's customers.
	Customers []string
	// Meters the key may write; empty: any.
	Meters []string
	// Rate in events per second per replica; 0: no bound.
	Rate float64
	// CreatedBy is a note kept with the key (who or what it is for).
	CreatedBy string
}

// CreateKey makes a key for an existing tenant and returns it with its
// token, which is shown this once: only its hash is stored. A tenant that
// does not exist yet is made with the key's customers.
func (a *Admin) CreateKey(ctx context.Context, spec KeySpec) (Key, string, error) {
	if err := checkTenant(spec.Tenant); err != nil {
		return Key{}, "", err
	}
	// NaN and infinities are no JSON numbers: the key's record would not
	// encode.
	if spec.Rate < 0 || math.IsNaN(spec.Rate) || math.IsInf(spec.Rate, 0) {
		return Key{}, "", fmt.Errorf("ingest: rate must be a non-negative number of events per second (got %g)", spec.Rate)
	}
	if err := CheckMeters(spec.Meters); err != nil {
		return Key{}, "", err
	}
	k, err := a.load(ctx)
	if err != nil {
		return Key{}, "", err
	}
	_, tenants := k.Snapshot()
	var t *Tenant
	for i := range tenants {
		if tenants[i].Name == spec.Tenant {
			t = &tenants[i]
		}
	}
	customers := spec.Customers
	switch {
	case t == nil && len(customers) == 0:
		return Key{}, "", fmt.Errorf("ingest: tenant %q does not exist: name its customers (--allow-customers) to make it with the key", spec.Tenant)
	case t == nil:
		if _, err := a.SetTenant(ctx, spec.Tenant, customers); err != nil {
			return Key{}, "", err
		}
	case len(customers) == 0:
		customers = []string{"*"}
	default:
		if err := CheckPatterns("customers", customers); err != nil {
			return Key{}, "", err
		}
		var errs []error
		for _, c := range customers {
			if !covers(t.Customers, c) {
				errs = append(errs, fmt.Errorf("ingest: customers %q is not within tenant %s's customers %v", c, t.Name, t.Customers))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return Key{}, "", err
		}
	}
	id, token, err := newToken()
	if err != nil {
		return Key{}, "", err
	}
	h := hashToken(token)
	key := Key{ID: id, Tenant: spec.Tenant, Customers: customers, Meters: spec.Meters, Rate: spec.Rate,
		Hash: fmt.Sprintf("%x", h[:]), Created: a.now().UTC(), CreatedBy: spec.CreatedBy}
	if err := a.write(ctx, keyRecordKey(id), record{Key: &key}); err != nil {
		return Key{}, "", err
	}
	return key, token, nil
}

// ErrNoSuchKey is returned by RevokeKey for an ID no key has.
var ErrNoSuchKey = errors.New("no such key")

// RevokeKey revokes a key by ID (or by a token's ID part; blanks around
// either are ignored). Every replica refuses it from the moment it reads
// the record. An argument that is neither is refused unquoted: it may be
// a mistyped live token.
func (a *Admin) RevokeKey(ctx context.Context, id string) (Key, error) {
	id = strings.TrimSpace(id)
	if tid := tokenID(id); tid != "" {
		id = tid // a whole token was given; only its ID is used
	}
	if !isKeyID(id) {
		return Key{}, fmt.Errorf("ingest: %w: the argument (%d bytes) is neither a key ID (16 hex digits, as `keys list` shows) nor a whole token", ErrNoSuchKey, len(id))
	}
	k, err := a.load(ctx)
	if err != nil {
		return Key{}, err
	}
	k.mu.RLock()
	key := k.keys[id]
	k.mu.RUnlock()
	if key == nil {
		return Key{}, fmt.Errorf("ingest: %w: %q (meterline keys list shows every key's ID)", ErrNoSuchKey, id)
	}
	r := *key
	if r.Active() {
		r.Revoked = a.now().UTC()
		if err := a.write(ctx, keyRecordKey(id), record{Key: &r}); err != nil {
			return Key{}, err
		}
	}
	return r, nil
}

// checkTenant refuses a tenant name checkName refuses, and noTenant: the
// ingest metrics' tenant label of requests without a valid key, which a
// tenant of that name could not be told from.
func checkTenant(name string) error {
	if name == noTenant {
		return fmt.Errorf("ingest: tenant %q is reserved: it is the tenant label of requests without a valid key in the ingest metrics", name)
	}
	return checkName("tenant", name)
}

// checkName refuses a name that is empty, longer than 128 bytes, or holds
// '/', a blank (unicode.IsSpace: a carriage return, a no-break space …),
// or what schemas.CheckText refuses in an identity: bytes that are not
// UTF-8, a control or an invisible character. A tenant's name is its
// label in the metrics, on the status page and in `keys list`: one that
// shows as another's ("acme\u200b" as "acme") could not be told from it.
func checkName(field, v string) error {
	if v == "" || len(v) > 128 || strings.ContainsFunc(v, func(r rune) bool { return r == '/' || unicode.IsSpace(r) }) ||
		schemas.CheckText(field, v, true) != nil {
		return fmt.Errorf("ingest: %s %q: want 1 to 128 bytes of UTF-8 without '/', blanks, control or invisible characters", field, v)
	}
	return nil
}
