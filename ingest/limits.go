package ingest

import (
	"bytes"
	"cmp"
	"math"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiters hold one token bucket per key, counting events. A key with a
// rate spends its bucket on accepted events and on refused requests. A
// key without one has a bucket of refusalRate that only refused requests
// spend (its refusal budget): its accepted events are not bounded, but a
// refused request costs the replica its parse without a Kafka
// acknowledgement to wait for, so refusals, unbounded, would come as fast
// as the replica can refuse them. The bound is per replica: N replicas
// behind a load balancer let a key send up to N times its rate.
//
// A bucket is kept only while it differs from a new one, which is full:
// a full bucket is dropped (sweep), so the buckets of keys revoked, or
// gone from the keys topic, do not stay for ever. A spent one is kept
// until it has refilled, whatever became of its key: a key reinstated
// with its ID (its record written back) goes on with the bucket it had,
// and cannot pass its rate by a round trip through revocation. At most
// maxBuckets are kept (evict).
type limiters struct {
	maxEvents   int
	refusalRate float64 // <= 0: keys without a rate have no refusal budget
	maxBuckets  int
	mu          sync.Mutex // held across each operation on a bucket: sweep never drops one in use
	byKey       map[string]*rate.Limiter
	// latest is the latest time a bucket was used at (at).
	latest time.Time
	// swept is when sweep last ran.
	swept time.Time
	// floor is when the last bucket evicted before it refilled would have
	// been full: a bucket made before then starts as spent as that one.
	floor time.Time
}

// defaultMaxBuckets bounds the buckets a replica keeps (about 150 bytes
// each): far more than the keys that spend their buckets within one
// refill of each other in any deployment the ingest is sized for.
const defaultMaxBuckets = 100_000

// sweepEvery is how often sweep looks for full buckets.
const sweepEvery = time.Second

func newLimiters(maxEvents int, refusalRate float64) *limiters {
	return &limiters{maxEvents: maxEvents, refusalRate: refusalRate, maxBuckets: defaultMaxBuckets, byKey: map[string]*rate.Limiter{}}
}

// rate is the rate of the key's bucket: its own, or the refusal budget
// for a key without one; 0: no bucket.
func (l *limiters) rate(k *Key) float64 {
	if k.Rate > 0 {
		return k.Rate
	}
	return max(l.refusalRate, 0)
}

// bucket is the key's token bucket, made on its first use (or its first
// use since sweep dropped it, full). A key whose rate changed since (its
// record in the keys topic rewritten, with a rate or without one) has its
// bucket set to the new rate at now, its tokens kept (at most the new
// size). l.mu is held.
func (l *limiters) bucket(k *Key, now time.Time) *rate.Limiter {
	l.sweep(now)
	r := l.rate(k)
	burst := max(int(math.Ceil(r)), l.maxEvents)
	lim := l.byKey[k.ID]
	if lim == nil {
		if len(l.byKey) >= l.maxBuckets {
			l.evict(now)
		}
		lim = rate.NewLimiter(rate.Limit(r), burst)
		if l.floor.After(now) {
			// It may be the bucket of an evicted key: as spent as that one.
			spent := math.Ceil(r * l.floor.Sub(now).Seconds())
			lim.ReserveN(now, int(min(spent, float64(burst))))
		}
		l.byKey[k.ID] = lim
	} else if lim.Limit() != rate.Limit(r) {
		lim.SetLimitAt(now, rate.Limit(r))
		lim.SetBurstAt(now, burst)
	}
	return lim
}

// at is the time to use the buckets at for a request received at now:
// now, or the latest time they were used at when that is later. Requests
// come to the buckets out of the order of their times (each after its
// body was read, which a slow client stretches up to the read timeout):
// a bucket used at a time before its last use would start its refill
// again from that time, and refill the time between twice. l.mu is held.
func (l *limiters) at(now time.Time) time.Time {
	if now.Before(l.latest) {
		return l.latest
	}
	l.latest = now
	return now
}

// full reports whether lim holds its whole size at now: it is then the
// same as a new bucket.
func full(lim *rate.Limiter, now time.Time) bool {
	return lim.TokensAt(now) >= float64(lim.Burst())
}

// sweep drops the full buckets, at most once every sweepEvery: dropping
// one changes nothing (the next use makes it again, full), and the
// buckets of keys no longer used (revoked, deleted) go. l.mu is held.
func (l *limiters) sweep(now time.Time) {
	if now.Sub(l.swept) < sweepEvery {
		return
	}
	l.swept = now
	for id, lim := range l.byKey {
		if full(lim, now) {
			delete(l.byKey, id)
		}
	}
}

// evict makes room for a bucket when maxBuckets are kept and none is
// full: it drops the eighth of the buckets that will be full the soonest,
// and raises floor to when the last of them will, so that none of their
// keys gets a fuller bucket by coming back (nor does any key, until
// then). l.mu is held.
func (l *limiters) evict(now time.Time) {
	l.swept = time.Time{}
	if l.sweep(now); len(l.byKey) < l.maxBuckets {
		return
	}
	type due struct {
		id   string
		when time.Duration
	}
	dues := make([]due, 0, len(l.byKey))
	for id, lim := range l.byKey {
		var when time.Duration // a bucket that does not refill (none is made) is as good as new
		if r := float64(lim.Limit()); r > 0 {
			when = refill(float64(lim.Burst())-lim.TokensAt(now), r)
		}
		dues = append(dues, due{id, when})
	}
	slices.SortFunc(dues, func(a, b due) int { return cmp.Compare(a.when, b.when) })
	for _, d := range dues[:max(len(dues)/8, 1)] {
		delete(l.byKey, d.id)
		if f := now.Add(d.when); f.After(l.floor) {
			l.floor = f
		}
	}
}

// take takes n events from the key's bucket at now, or returns how long
// to wait before the request could pass. A request refused so costs one
// token (its parse was not free): otherwise a key that keeps its bucket
// short of a batch could have batches parsed and refused without end.
// The bucket holds a second of the rate, and at least one full request.
// A key without a rate takes nothing: its bucket is for refusals only.
func (l *limiters) take(k *Key, n int, now time.Time) time.Duration {
	if k.Rate <= 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now = l.at(now)
	lim := l.bucket(k, now)
	r := lim.ReserveN(now, n)
	if !r.OK() {
		return time.Second // more than a full bucket: never passes (not reached: the bucket holds a full request)
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		lim.ReserveN(now, 1) // kept: the refusal's cost
		if t := lim.TokensAt(now); t < float64(n) {
			return refill(float64(n)-t, k.Rate)
		}
		return min(d, maxWait)
	}
	return 0
}

// admit is checked before a request's body is read: it returns how long
// to wait until the key's bucket holds a token again (0: it does, or the
// key has no bucket). Nothing is taken. A request that would pass take
// passes admit, so accepted traffic is not changed by it; a key that has
// spent its bucket, on accepted events or on refused requests (charge),
// is answered 429 before its body costs anything.
func (l *limiters) admit(k *Key, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.wait(k, l.at(now))
}

// wait is admit with l.mu held.
func (l *limiters) wait(k *Key, now time.Time) time.Duration {
	r := l.rate(k)
	if r <= 0 {
		return 0
	}
	lim := l.bucket(k, now)
	if t := lim.TokensAt(now); t < 1 {
		return refill(1-t, r)
	}
	return 0
}

// maxWait bounds refill: a century, past any Retry-After a client waits
// out, and far inside time.Duration.
const maxWait = 100 * 365 * 24 * time.Hour

// refill is how long a bucket of rate r (> 0) takes to gain tokens,
// rounded up to the nanosecond, at most maxWait: for a tiny rate it is
// longer than time.Duration holds, and the conversion would wrap it
// negative, a wait of none, letting every request through.
func refill(tokens, r float64) time.Duration {
	if s := tokens / r; s < maxWait.Seconds() {
		return time.Duration(math.Ceil(s * float64(time.Second)))
	}
	return maxWait
}

// charge takes the cost of a refused request from the key's bucket at
// now: n tokens, at least 1 and at most the bucket's size, whether the
// bucket holds them or not (it goes into debt, which admit then makes
// the key wait out). It returns how long to wait until the bucket holds
// a token again.
func (l *limiters) charge(k *Key, n int, now time.Time) time.Duration {
	if l.rate(k) <= 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now = l.at(now)
	lim := l.bucket(k, now)
	lim.ReserveN(now, min(max(n, 1), lim.Burst())) // kept: the tokens are spent
	return l.wait(k, now)
}

// countEvents counts the events of a body without decoding it or
// allocating: its non-blank lines (NDJSON), or the elements of a JSON
// array (at least 1). The count is exact for a valid body of at least one
// event.
func countEvents(body []byte, ndjson bool) int {
	if ndjson {
		n := 0
		for l := range bytes.SplitSeq(body, []byte("\n")) {
			if len(trimSpace(l)) > 0 {
				n++
			}
		}
		return n
	}
	b := trimSpace(body)
	if len(b) == 0 || b[0] != '[' {
		return 1
	}
	n, depth := 1, 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
		case ']', '}':
			depth--
		case ',':
			if depth == 1 {
				n++
			}
		}
	}
	return n
}

// Which in-flight bound refused a request (inflight.enter, and the label
// of meterline_ingest_inflight_refused_total).
const (
	limitGlobal = "global" // every slot is taken (503)
	limitTenant = "tenant" // the tenant holds MaxInFlightPerTenant (429)
	limitShare  = "share"  // the tenant holds as many as are free (429)
)

// inflight bounds the requests being served at once, in all and per
// tenant (all its keys together): each may hold a body of up to
// MaxBodyBytes while it arrives and is parsed, and wait for Kafka's
// acknowledgement. A client that trickles its body holds its slot until
// the read timeout, so the slots are shared out among tenants:
//
//   - a tenant holds at most perTenant;
//   - a tenant is admitted only while it holds fewer requests than there
//     are free slots (its fair share of what is left): the last slots go
//     to the tenants that hold the fewest, so that filling every slot
//     takes many tenants, not a few that hold their bound each (with 256
//     slots and 64 a tenant, 10 tenants; with no bound per tenant, one
//     tenant holds at most half the slots, two three quarters, and so
//     on).
//
// A bound of 0 or less is none (with no bound in all, there is no share
// either).
type inflight struct {
	max, perTenant int
	mu             sync.Mutex
	total          int
	byTenant       map[string]int
}

func newInflight(max, perTenant int) *inflight {
	return &inflight{max: max, perTenant: perTenant, byTenant: map[string]int{}}
}

// enter admits a request of tenant ("": admitted, and leave must follow)
// or names the bound it would pass (limitGlobal, limitTenant,
// limitShare); held is the tenant's requests in flight, free the free
// slots (-1: no bound in all).
func (f *inflight) enter(tenant string) (limit string, held, free int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held, free = f.byTenant[tenant], -1
	if f.max > 0 {
		free = f.max - f.total
	}
	switch {
	case f.max > 0 && free <= 0:
		return limitGlobal, held, free
	case f.perTenant > 0 && held >= f.perTenant:
		return limitTenant, held, free
	case f.max > 0 && held >= free:
		return limitShare, held, free
	}
	f.total++
	f.byTenant[tenant]++
	return "", held, free
}

// leave ends a request of tenant that enter admitted.
func (f *inflight) leave(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total--
	if f.byTenant[tenant]--; f.byTenant[tenant] <= 0 {
		delete(f.byTenant, tenant)
	}
}

// count is the requests in flight.
func (f *inflight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}
