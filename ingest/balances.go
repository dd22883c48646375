package ingest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/schemas"
)

// Balances is an ingest replica's view of usage.balances (docs/ingest.md,
// The quota gate): the latest balance of each customer, as the aggregator
// wrote it. It feeds the advisory quota gate (gate.go). It is safe for
// concurrent use.
//
// Age. A balance is as of its updated_at: broker time (the later of the
// aggregator partition's watermark and the latest arrival it counts,
// never before the customer's balance before it)
// carried in the record; the aggregator writes a customer's balance at
// most once per its BalanceInterval (1 s by default), so GateMaxAge must
// stay well above that. Its age is the broker
// time now minus its updated_at, and the broker time now is estimated
// from records that arrived live only: records appended after the
// current read of the topic started, read once it has caught up. The
// estimate is the largest (record timestamp read + time elapsed on this
// replica since it was read) over those records; a record's timestamp is
// the time it was written (the broker's with message.timestamp.type
// LogAppendTime, the aggregator's clock with CreateTime), and the
// elapsed time is a difference of two readings of the clock (time.Now:
// monotonic), so this replica's clock setting or skew changes nothing.
// Until a record has arrived live, every balance's age is unknown and no
// balance is trusted. So:
//   - a replica started after the aggregator stopped writing trusts none
//     of the balances it loaded, however recent their updated_at;
//   - an aggregator that lags writes balances whose updated_at is behind
//     their timestamps by the lag: they are as old as the lag;
//   - when the aggregator stops writing, every balance ages at the
//     replica's own pace from the last record that arrived.
//
// Caps in effect. A balance's caps_until is when its caps stop being
// those in effect (a change of its caps or unmetered scheduled for later,
// as far as the aggregator had read the entitlements); no balance is trusted
// (Trusted) once the same estimate of the broker time now reaches it, so
// the gate opens then without waiting for a balance the aggregator
// writes only when the customer's usage or entitlements change.
type Balances struct {
	topic string
	log   *zap.Logger
	clock func() time.Time // only differences of its readings are used

	mu       sync.RWMutex
	m        map[string]*schemas.Balance
	live     bool      // the current read of the topic has caught up: records now arrive live
	anchor   int64     // the timestamp of a record that arrived live, epoch ms: see Balances
	anchorAt time.Time // when it was read, by clock; zero: no record arrived live
	bad      int       // records that could not be read

	loaded chan struct{}
	once   sync.Once
}

// NewBalances returns an empty view of topic; Follow fills it. clock (nil:
// time.Now) is read only to measure the time elapsed since a record
// arrived live (see Balances).
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
		// A read from the start replays old records: they are not live
		// until it has caught up again.
		b.setLive(false)
		err := tail(ctx, b.topic, "balances", b.log, opts, b.applyRecord, func(time.Time) { b.caughtUp() }, 0, nil)
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

// caughtUp is called when the current read of the topic has read every
// record the topic had when it started: the view is loaded, and the
// records read from now on arrive live.
func (b *Balances) caughtUp() {
	b.markLoaded()
	b.setLive(true)
}

func (b *Balances) setLive(live bool) {
	b.mu.Lock()
	b.live = live
	b.mu.Unlock()
}

// applyRecord applies r; if it arrived live, its timestamp moves the
// estimate of the broker time now forward (see Balances).
func (b *Balances) applyRecord(r *kgo.Record) {
	b.apply(r.Key, r.Value)
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.live {
		return
	}
	ts, now := r.Timestamp.UnixMilli(), b.clock()
	if cur, ok := b.brokerNowAt(now); !ok || ts > cur {
		b.anchor, b.anchorAt = ts, now
	}
}

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
}

func (b *Balances) unreadable(err error) {
	b.mu.Lock()
	b.bad++
	b.mu.Unlock()
	b.log.Error("unreadable record in the balances topic; it changes nothing", zap.String("topic", b.topic), zap.Error(err))
}

// BrokerNow is the view's estimate of the broker time now, epoch ms (see
// Balances); ok is false until a record has arrived live.
func (b *Balances) BrokerNow() (ms int64, ok bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.brokerNowAt(b.clock())
}

func (b *Balances) brokerNowAt(now time.Time) (int64, bool) {
	if b.anchorAt.IsZero() {
		return 0, false
	}
	return b.anchor + max(now.Sub(b.anchorAt).Milliseconds(), 0), true
}

// unknownAge is the age of every balance until a record has arrived
// live: older than any limit.
const unknownAge = time.Duration(math.MaxInt64)

// Lookup returns the customer's balance and its age (see Balances;
// unknownAge until a record has arrived live); ok is false when the view
// has none. The balance must not be modified.
func (b *Balances) Lookup(customer string) (bal *schemas.Balance, age time.Duration, ok bool) {
	bal, age, _, ok = b.lookup(customer)
	return bal, age, ok
}

// Trusted returns the customer's balance if the quota gate may decide by
// it: younger than maxAge (Lookup), and its caps still those in effect:
// the broker time now is before its caps_until (0: no change scheduled),
// when a change of its caps or unmetered that the aggregator knew of takes
// effect. ok is false otherwise, or when the view has none. The balance
// must not be modified.
func (b *Balances) Trusted(customer string, maxAge time.Duration) (bal *schemas.Balance, ok bool) {
	bal, age, now, ok := b.lookup(customer)
	if !ok || age >= maxAge || bal.CapsUntil != 0 && now >= bal.CapsUntil {
		return nil, false
	}
	return bal, true
}

// lookup is Lookup, with the broker time now it measured the age against
// (meaningful only when the age is not unknownAge).
func (b *Balances) lookup(customer string) (bal *schemas.Balance, age time.Duration, now int64, ok bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	bal = b.m[customer]
	if bal == nil {
		return nil, 0, 0, false
	}
	now, known := b.brokerNowAt(b.clock())
	if !known {
		return bal, unknownAge, 0, true
	}
	ms := now - bal.UpdatedAt
	if lim := int64(unknownAge / time.Millisecond); bal.UpdatedAt < 0 || ms > lim || ms < -lim {
		return bal, unknownAge, now, true
	}
	return bal, time.Duration(ms) * time.Millisecond, now, true
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
