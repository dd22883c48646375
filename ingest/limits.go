package ingest

import (
	"bytes"
	"math"
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
type limiters struct {
	maxEvents   int
	refusalRate float64 // <= 0: keys without a rate have no refusal budget
	mu          sync.Mutex
	byKey       map[string]*rate.Limiter
}

func newLimiters(maxEvents int, refusalRate float64) *limiters {
	return &limiters{maxEvents: maxEvents, refusalRate: refusalRate, byKey: map[string]*rate.Limiter{}}
}

// rate is the rate of the key's bucket: its own, or the refusal budget
// for a key without one; 0: no bucket.
func (l *limiters) rate(k *Key) float64 {
	if k.Rate > 0 {
		return k.Rate
	}
	return max(l.refusalRate, 0)
}

// bucket is the key's token bucket, made on its first use. A key whose
// rate changed since (its record in the keys topic rewritten, with a rate
// or without one) has its bucket set to the new rate at now, its tokens
// kept (at most the new size).
func (l *limiters) bucket(k *Key, now time.Time) *rate.Limiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rate(k)
	burst := max(int(math.Ceil(r)), l.maxEvents)
	lim := l.byKey[k.ID]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(r), burst)
		l.byKey[k.ID] = lim
	} else if lim.Limit() != rate.Limit(r) {
		lim.SetLimitAt(now, rate.Limit(r))
		lim.SetBurstAt(now, burst)
	}
	return lim
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
	lim := l.bucket(k, now)
	r := lim.ReserveN(now, n)
	if !r.OK() {
		return time.Second // more than a full bucket: never passes (not reached: the bucket holds a full request)
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		lim.ReserveN(now, 1) // kept: the refusal's cost
		if t := lim.TokensAt(now); t < float64(n) {
			return time.Duration((float64(n) - t) / k.Rate * float64(time.Second))
		}
		return d
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
	r := l.rate(k)
	if r <= 0 {
		return 0
	}
	lim := l.bucket(k, now)
	if t := lim.TokensAt(now); t < 1 {
		return time.Duration((1 - t) / r * float64(time.Second))
	}
	return 0
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
	lim := l.bucket(k, now)
	lim.ReserveN(now, min(max(n, 1), lim.Burst())) // kept: the tokens are spent
	return l.admit(k, now)
}

// countEvents counts the events of a body without decoding it or
// allocating: its non-blank lines (NDJSON), or the elements of a JSON
// array (at least 1). The count is exact for a valid body of at least one
// event.
func countEvents(body []byte, ndjson bool) int {
	if ndjson {
		n := 0
		for l := range bytes.SplitSeq(body, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 {
				n++
			}
		}
		return n
	}
	b := bytes.TrimSpace(body)
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
	limitGlobal = "global"
	limitKey    = "key"
)

// inflight bounds the requests being served at once, in all and per key:
// each may hold a body of up to MaxBodyBytes while it arrives and is
// parsed, and wait for Kafka's acknowledgement. A bound of 0 or less is
// none.
type inflight struct {
	max, perKey int
	mu          sync.Mutex
	total       int
	byKey       map[string]int
}

func newInflight(max, perKey int) *inflight {
	return &inflight{max: max, perKey: perKey, byKey: map[string]int{}}
}

// enter admits a request of key id ("": admitted, and leave must follow)
// or names the bound it would pass (limitGlobal, limitKey).
func (f *inflight) enter(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.max > 0 && f.total >= f.max:
		return limitGlobal
	case f.perKey > 0 && f.byKey[id] >= f.perKey:
		return limitKey
	}
	f.total++
	f.byKey[id]++
	return ""
}

// leave ends a request enter admitted.
func (f *inflight) leave(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total--
	if f.byKey[id]--; f.byKey[id] <= 0 {
		delete(f.byKey, id)
	}
}

// count is the requests in flight.
func (f *inflight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}
