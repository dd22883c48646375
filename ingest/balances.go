package ingest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/schemas"
)

// Balances is an ingest replica's view of usage.balances (DESIGN §12): the
// latest balance of each customer, as the aggregator wrote it. It feeds
// the advisory quota gate (gate.go). It is safe for concurrent use.
//
// Age. A balance is as of its updated_at: broker time (the aggregator
// partition's watermark) carried in the record, never a wall clock.
// BrokerNow estimates the broker time now as the newest updated_at this
// view has read, plus the time elapsed on this replica since it read it;
// the elapsed time is a difference of two readings of the clock (time.Now:
// monotonic), so the clock's setting or skew against the brokers changes
// nothing. A balance's age is BrokerNow − its updated_at. So a balance is
// judged against the newest of its peers, and, when the aggregator stops
// writing balances, every balance ages at the replica's own pace from the
// moment the newest one was read.
type Balances struct {
	topic string
	log   *zap.Logger
	clock func() time.Time // only differences of its readings are used

	mu     sync.RWMutex
	m      map[string]*schemas.Balance
	newest int64     // the largest updated_at read, epoch ms
	readAt time.Time // when newest was read, by clock
	bad    int       // records that could not be read

	loaded chan struct{}
	once   sync.Once
}

// NewBalances returns an empty view of topic; Follow fills it. clock (nil:
// time.Now) is read only to measure the time elapsed since the newest
// balance was read.
func NewBalances(topic string, log *zap.Logger, clock func() time.Time) *Balances {
	if log == nil {
		log = zap.NewNop()
	}
	if clock == nil {
		clock = time.Now
	}
	return &Balances{topic: topic, log: log, clock: clock, m: map[string]*schemas.Balance{}, loaded: make(chan struct{})}
}

// Loaded is closed once the view holds every record the topic had when
// Follow first started.
func (b *Balances) Loaded() <-chan struct{} { return b.loaded }

func (b *Balances) isLoaded() bool {
	select {
	case <-b.loaded:
		return true
	default:
		return false
	}
}

// balancesRetry is how long Follow waits before reading the topic again
// after an error (the topic missing, no ACL to read it).
const balancesRetry = 10 * time.Second

// Follow reads the balances topic from its start and applies each record,
// until ctx ends; it then returns nil. opts are added to the client (TLS,
// SASL). The gate is advisory, so an error (no such topic, no ACL) never
// ends Follow: it is logged and the topic is read again after a while;
// meanwhile the view is not loaded or not updated and the gate lets
// events through.
func (b *Balances) Follow(ctx context.Context, opts ...kgo.Opt) error {
	for {
		err := tail(ctx, b.topic, "balances", b.log, opts, b.applyRecord, b.markLoaded)
		if ctx.Err() != nil {
			return nil
		}
		b.log.Warn("cannot read the balances topic; the quota gate lets every event through until it can",
			zap.String("topic", b.topic), zap.Duration("retry_in", balancesRetry), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(balancesRetry):
		}
	}
}

func (b *Balances) markLoaded() { b.once.Do(func() { close(b.loaded) }) }

func (b *Balances) applyRecord(r *kgo.Record) { b.apply(r.Key, r.Value) }

// apply applies one record: a tombstone forgets the customer of its key;
// a balance replaces the customer's unless it has a smaller revision (a
// re-read after an error replays older ones). An unreadable record is
// logged and counted, and changes nothing.
func (b *Balances) apply(key, value []byte) {
	if value == nil {
		c, err := schemas.ParseCustomerKey(key)
		if err != nil {
			b.unreadable(err)
			return
		}
		b.mu.Lock()
		delete(b.m, c)
		b.mu.Unlock()
		return
	}
	var bal schemas.Balance
	if err := schemas.DecodeInto(value, &bal); err != nil {
		b.unreadable(err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.m[bal.CustomerID]; old == nil || bal.Revision >= old.Revision {
		b.m[bal.CustomerID] = &bal
	}
	if bal.UpdatedAt > b.newest || b.readAt.IsZero() {
		b.newest = max(b.newest, bal.UpdatedAt)
		b.readAt = b.clock()
	}
}

func (b *Balances) unreadable(err error) {
	b.mu.Lock()
	b.bad++
	b.mu.Unlock()
	b.log.Error("unreadable record in the balances topic; it changes nothing", zap.String("topic", b.topic), zap.Error(err))
}

// BrokerNow is the view's estimate of the broker time now, epoch ms (see
// Balances); ok is false before any balance was read.
func (b *Balances) BrokerNow() (ms int64, ok bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.brokerNowLocked()
}

func (b *Balances) brokerNowLocked() (int64, bool) {
	if b.readAt.IsZero() {
		return 0, false
	}
	return b.newest + max(b.clock().Sub(b.readAt).Milliseconds(), 0), true
}

// Lookup returns the customer's balance and its age (see Balances); ok
// is false when the view has none. The balance must not be modified.
func (b *Balances) Lookup(customer string) (bal *schemas.Balance, age time.Duration, ok bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	bal = b.m[customer]
	if bal == nil {
		return nil, 0, false
	}
	now, _ := b.brokerNowLocked()
	return bal, time.Duration(now-bal.UpdatedAt) * time.Millisecond, true
}

// Len is the number of customers with a balance in the view.
func (b *Balances) Len() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.m)
}

// describePeriod is "[2026-12-01T00:00:00Z, 2027-01-01T00:00:00Z)".
func describePeriod(start, end int64) string {
	return fmt.Sprintf("[%s, %s)", time.UnixMilli(start).UTC().Format(time.RFC3339), time.UnixMilli(end).UTC().Format(time.RFC3339))
}
