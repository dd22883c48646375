package ingest

import (
	"bytes"
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
