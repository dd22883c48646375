package ingest

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiters hold one token bucket per key with a rate, counting events.
// The bound is per replica: N replicas behind a load balancer let a key
// send up to N times its rate.
type limiters struct {
	maxEvents int
	mu        sync.Mutex
	byKey     map[string]*rate.Limiter
}

func newLimiters(maxEvents int) *limiters {
	return &limiters{maxEvents: maxEvents, byKey: map[string]*rate.Limiter{}}
}

// take takes n events from the key's bucket at now, or returns how long
// to wait before the request could pass (nothing is taken then). The
// bucket holds a second of the rate, and at least one full request.
func (l *limiters) take(k *Key, n int, now time.Time) time.Duration {
	if k.Rate <= 0 {
		return 0
	}
	l.mu.Lock()
	lim := l.byKey[k.ID]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(k.Rate), max(int(math.Ceil(k.Rate)), l.maxEvents))
		l.byKey[k.ID] = lim
	}
	l.mu.Unlock()
	r := lim.ReserveN(now, n)
	if !r.OK() {
		return time.Second // more than a full bucket: never passes (not reached: the bucket holds a full request)
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}
