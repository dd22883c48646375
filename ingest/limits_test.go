package ingest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

// answerOf reads the status line of the answer on conn within 5s.
func answerOf(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(io.LimitReader(r, 12))
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return string(b)
}

// rateEnv is newEnv on a fixed clock (the buckets do not refill), with
// MaxEvents 10 and a second key of tenant acme with rate, whose token it
// returns.
func rateEnv(t *testing.T, rate float64, mod func(*Config)) (*env, string) {
	t.Helper()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	e := newEnv(t, func(c *Config) {
		c.MaxEvents, c.Clock = 10, func() time.Time { return now }
		if mod != nil {
			mod(c)
		}
	})
	_, token, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme", Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 2)
	return e, token
}

// A refused request costs its key's bucket as many tokens as the events
// it held (at least 1): a key that spent its bucket on refused requests
// is answered 429 before its next body is read, as one that spent it on
// accepted events. The clock is fixed: the bucket does not refill.
func TestRefusedRequestsCost(t *testing.T) {
	e, token := rateEnv(t, 10, nil)
	bad := `{"event_id":"x","customer_id":"acme-1","meter":"api_calls","quantity":"no","event_time":"2026-11-29T12:00:00Z"}`
	batch := "[" + strings.TrimSuffix(strings.Repeat(bad+",", 5), ",") + "]"
	// The bucket holds 10 tokens: two requests of 5 invalid events spend it.
	for i := range 2 {
		if status, _, b := e.post("/v1/events", "application/json", token, []byte(batch)); status != http.StatusBadRequest {
			t.Fatalf("invalid request %d: %d %s, want 400", i, status, b)
		}
	}
	status, hdr, b := e.post("/v1/events", "application/json", token, apiCall("ok", "acme-1"))
	if status != http.StatusTooManyRequests {
		t.Fatalf("a valid request after 10 refused events: %d %s, want 429", status, b)
	}
	if p := problem(t, b); p.Type != "urn:meterline:problem:rate-limited" || p.RetryAfter < 1 || hdr.Get("Retry-After") != strconv.Itoa(p.RetryAfter) {
		t.Errorf("problem %+v, Retry-After %q", p, hdr.Get("Retry-After"))
	}
	// Answered before the body is read: a request whose body never comes
	// is answered at once.
	conn := startSlowRequest(t, e.srv.Addr(), token, apiCall("slow", "acme-1"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got := answerOf(t, conn); got != "HTTP/1.1 429" {
		t.Errorf("a request of a spent key whose body has not arrived was answered %q, want 429 at once", got)
	}
	// A request refused as a whole (415) costs a token too.
	_, token2, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme", Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 3)
	// Rate 1: the bucket holds 10 (a full request); 10 refusals spend it.
	for i := range 10 {
		if status, _, b := e.post("/v1/events", "text/plain", token2, apiCall("p", "acme-1")); status != http.StatusUnsupportedMediaType {
			t.Fatalf("request %d: %d %s, want 415", i, status, b)
		}
	}
	if status, _, b := e.post("/v1/events", "application/json", token2, apiCall("q", "acme-1")); status != http.StatusTooManyRequests {
		t.Fatalf("a valid request after 10 requests refused 415: %d %s, want 429", status, b)
	}
	// A key without a rate is charged only to its refusal budget (1000
	// events by default, TestRefusalBudget), far from spent; the tenant's
	// other key has its own bucket.
	for i := range 3 {
		if status, _, _ := e.post("/v1/events", "application/json", e.token, []byte(batch)); status != http.StatusBadRequest {
			t.Fatalf("unbounded key, invalid request %d: %d", i, status)
		}
	}
	if status, _, b := e.post("/v1/events", "application/json", e.token, apiCall("r", "acme-1")); status != http.StatusAccepted {
		t.Fatalf("unbounded key: %d %s, want 202", status, b)
	}
}

// A key without a rate has a refusal budget (Config.RefusalRate): its
// refused requests take from a bucket that its accepted events do not
// touch, and once they have spent it the key is answered 429 before its
// bodies are read, as a key that spent its rate; a negative RefusalRate
// is no budget. The clock is fixed: the buckets do not refill.
func TestRefusalBudget(t *testing.T) {
	e, _ := rateEnv(t, 10, func(c *Config) { c.RefusalRate = 10 })
	bad := `{"event_id":"x","customer_id":"acme-1","meter":"api_calls","quantity":"no","event_time":"2026-11-29T12:00:00Z"}`
	batch := []byte("[" + strings.TrimSuffix(strings.Repeat(bad+",", 5), ",") + "]")
	ten := []byte("[" + strings.TrimSuffix(strings.Repeat(string(apiCall("v", "acme-1"))+",", 10), ",") + "]")
	// Accepted events take nothing from it: 30 events, three times the
	// bucket.
	for i := range 3 {
		if status, _, b := e.post("/v1/events", "application/json", e.token, ten); status != http.StatusAccepted {
			t.Fatalf("valid request %d of a key without a rate: %d %s, want 202", i, status, b)
		}
	}
	// The bucket holds 10: two requests of 5 invalid events spend it.
	for i := range 2 {
		if status, _, b := e.post("/v1/events", "application/json", e.token, batch); status != http.StatusBadRequest {
			t.Fatalf("invalid request %d: %d %s, want 400", i, status, b)
		}
	}
	status, hdr, b := e.post("/v1/events", "application/json", e.token, apiCall("after", "acme-1"))
	if status != http.StatusTooManyRequests {
		t.Fatalf("a valid request after 10 refused events of a key without a rate: %d %s, want 429", status, b)
	}
	p := problem(t, b)
	if p.Type != "urn:meterline:problem:rate-limited" || p.RetryAfter < 1 || hdr.Get("Retry-After") != strconv.Itoa(p.RetryAfter) ||
		!strings.Contains(p.Detail, "refused") {
		t.Errorf("problem %+v, Retry-After %q", p, hdr.Get("Retry-After"))
	}
	conn := startSlowRequest(t, e.srv.Addr(), e.token, apiCall("slow", "acme-1"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got := answerOf(t, conn); got != "HTTP/1.1 429" {
		t.Errorf("a request of a key whose refusal budget is spent, its body not arrived, was answered %q, want 429 at once", got)
	}
	if n := len(e.records()); n != 30 {
		t.Errorf("%d records, want the 30 accepted", n)
	}

	// No budget: refusals are bounded by the in-flight limits only.
	e, _ = rateEnv(t, 10, func(c *Config) { c.RefusalRate = -1 })
	for i := range 5 {
		if status, _, b := e.post("/v1/events", "application/json", e.token, batch); status != http.StatusBadRequest {
			t.Fatalf("no budget, invalid request %d: %d %s, want 400", i, status, b)
		}
	}
	if status, _, b := e.post("/v1/events", "application/json", e.token, apiCall("nobudget", "acme-1")); status != http.StatusAccepted {
		t.Fatalf("no budget, after 25 refused events: %d %s, want 202", status, b)
	}
}

// A body that is not JSON costs its share of a full request: here 5,000
// of 10,000 bytes, 5 of 10 events.
func TestMalformedBodyCostsItsSize(t *testing.T) {
	e, token := rateEnv(t, 1, func(c *Config) { c.MaxBodyBytes = 10_000 })
	garbage := []byte(strings.Repeat("x", 5000))
	for i := range 2 {
		if status, _, b := e.post("/v1/events", "application/json", token, garbage); status != http.StatusBadRequest {
			t.Fatalf("malformed request %d: %d %s, want 400", i, status, b)
		}
	}
	if status, _, b := e.post("/v1/events", "application/json", token, apiCall("m", "acme-1")); status != http.StatusTooManyRequests {
		t.Fatalf("a valid request after two malformed bodies of half the limit: %d %s, want 429", status, b)
	}
}

// A request refused 429 for the rate once its events are parsed costs a
// token: a key keeping its bucket just short of its batches cannot have
// them parsed without end.
func TestRateLimitedRequestCosts(t *testing.T) {
	e, token := rateEnv(t, 10, nil)
	// 9 of the 10 tokens: 1 left.
	nine := "[" + strings.TrimSuffix(strings.Repeat(string(apiCall("n", "acme-1"))+",", 9), ",") + "]"
	if status, _, b := e.post("/v1/events", "application/json", token, []byte(nine)); status != http.StatusAccepted {
		t.Fatalf("9 events: %d %s", status, b)
	}
	two := "[" + string(apiCall("a", "acme-1")) + "," + string(apiCall("b", "acme-1")) + "]"
	if status, _, b := e.post("/v1/events", "application/json", token, []byte(two)); status != http.StatusTooManyRequests {
		t.Fatalf("2 events with 1 token: %d %s, want 429", status, b)
	}
	// The refusal took the last token: a single event no longer passes.
	if status, _, b := e.post("/v1/events", "application/json", token, apiCall("c", "acme-1")); status != http.StatusTooManyRequests {
		t.Fatalf("1 event after a 429: %d %s, want 429 (the 429 cost a token)", status, b)
	}
	if n := len(e.records()); n != 9 {
		t.Errorf("%d records, want 9", n)
	}
}

// The requests of a tenant in flight at once, all its keys together, are
// bounded (429 too-many-in-flight), and those of every tenant (503
// overloaded), before their bodies are read.
func TestInFlightBounds(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxInFlightPerTenant = 1; c.MaxInFlight = 2 })
	_, token2, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	_, beta, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "beta", Customers: []string{"beta-*"}})
	if err != nil {
		t.Fatal(err)
	}
	_, gamma, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "gamma", Customers: []string{"gamma-*"}})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 4)
	body := apiCall("slow", "acme-1")
	conn := startSlowRequest(t, e.srv.Addr(), e.token, body)
	time.Sleep(100 * time.Millisecond) // the slow request is in flight
	// A second request of the tenant is refused, by another of its keys too.
	for _, token := range []string{e.token, token2} {
		status, hdr, b := e.post("/v1/events", "application/json", token, apiCall("k", "acme-1"))
		if status != http.StatusTooManyRequests {
			t.Fatalf("a second request of the tenant: %d %s, want 429", status, b)
		}
		if p := problem(t, b); p.Type != "urn:meterline:problem:too-many-in-flight" || p.RetryAfter != 1 || hdr.Get("Retry-After") != "1" ||
			p.Detail != "tenant acme already has 1 requests in flight (its keys together); wait for their answers" {
			t.Errorf("problem %+v, Retry-After %q", p, hdr.Get("Retry-After"))
		}
	}
	// Another tenant passes; with two in flight, a third tenant is refused 503.
	betaBody := apiCall("slow", "beta-1")
	conn2 := startSlowRequest(t, e.srv.Addr(), beta, betaBody)
	time.Sleep(100 * time.Millisecond)
	status, _, b := e.post("/v1/events", "application/json", gamma, apiCall("g", "gamma-1"))
	if status != http.StatusServiceUnavailable {
		t.Fatalf("a third request in flight: %d %s, want 503", status, b)
	}
	if p := problem(t, b); p.Type != "urn:meterline:problem:overloaded" || p.RetryAfter != 1 {
		t.Errorf("problem %+v", p)
	}
	if v := testutil.ToFloat64(e.srv.metrics.inflight.WithLabelValues("acme", limitTenant)); v != 2 {
		t.Errorf("refused by the tenant's bound: %g, want 2", v)
	}
	if v := testutil.ToFloat64(e.srv.metrics.inflight.WithLabelValues("gamma", limitGlobal)); v != 1 {
		t.Errorf("refused by the global bound: %g, want 1", v)
	}
	// Once answered, their slots are free again.
	for i, c := range []interface {
		io.ReadWriter
		SetReadDeadline(time.Time) error
	}{conn, conn2} {
		if _, err := c.Write([][]byte{body, betaBody}[i][10:]); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if got := answerOf(t, c); got != "HTTP/1.1 202" {
			t.Fatalf("slow request answered %q, want 202", got)
		}
	}
	if status, _, b := e.post("/v1/events", "application/json", e.token, apiCall("after", "acme-1")); status != http.StatusAccepted {
		t.Fatalf("after the slow requests: %d %s, want 202", status, b)
	}
	if n := e.srv.inflight.count(); n != 0 {
		t.Errorf("%d requests in flight once all are answered", n)
	}
}

// A request with an unknown key is answered 401 before its body is read:
// it costs no key's budget, and must stay cheap.
func TestUnknownKeyBeforeBody(t *testing.T) {
	e := newEnv(t, nil)
	conn := startSlowRequest(t, e.srv.Addr(), "mlk_unknown", apiCall("x", "acme-1"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got := answerOf(t, conn); got != "HTTP/1.1 401" {
		t.Errorf("an unknown key's request whose body has not arrived was answered %q, want 401 at once", got)
	}
}

// TestBucketFollowsKeyRate: a key's bucket is made on its first request,
// with the rate the key had then: for a key without a rate, the refusal
// budget. A key record rewritten with a rate of its own (the keys topic is
// the key's only truth, read again by every replica) must be bounded by
// that rate from then on, not by the bucket its first request made; and
// the other way, a key whose rate is taken away has the refusal budget.
func TestBucketFollowsKeyRate(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	l := newLimiters(10, 1000)
	k := &Key{ID: "k"}
	if d := l.admit(k, now); d != 0 {
		t.Fatalf("a key without a rate, first request: wait %s", d)
	}
	k = &Key{ID: "k", Rate: 1}
	// Rate 1: the bucket holds one full request (10 events).
	if d := l.take(k, 10, now); d != 0 {
		t.Fatalf("first full request at rate 1: wait %s, want none", d)
	}
	if d := l.take(k, 10, now); d == 0 {
		t.Fatalf("a second full request in the same instant at rate 1 passed: the key's bucket is still the refusal budget's (1000/s)")
	}
	k = &Key{ID: "k"}
	l.admit(k, now.Add(time.Second)) // the bucket back at 0 tokens, at 1/s
	if d := l.admit(k, now.Add(time.Second+10*time.Millisecond)); d != 0 {
		t.Fatalf("the key's rate taken away: 10ms later, at a 1000/s refusal budget, wait %s, want none", d)
	}
}

// apiCalls is a batch of n events of Meterline's format (apiCall).
func apiCalls(n int) []byte {
	return []byte("[" + strings.TrimSuffix(strings.Repeat(string(apiCall("a", "acme-1"))+",", n), ",") + "]")
}

// clockEnv is newEnv with MaxEvents 10 on a clock that moves only when
// the test moves it (the buckets refill by it); move advances it.
func clockEnv(t *testing.T) (e *env, move func(time.Duration)) {
	t.Helper()
	var now atomic.Int64
	now.Store(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).UnixNano())
	e = newEnv(t, func(c *Config) {
		c.MaxEvents, c.Clock = 10, func() time.Time { return time.Unix(0, now.Load()).UTC() }
	})
	return e, func(d time.Duration) { now.Add(int64(d)) }
}

// hasBucket reports whether the server keeps a bucket for key id.
func (e *env) hasBucket(id string) bool {
	l := e.srv.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byKey[id] != nil
}

// tombstone deletes key id from the keys topic.
func (e *env) tombstone(id string) {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: e.keys, Key: []byte(keyRecordKey(id))}).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// waitKeyGone waits until the server no longer authenticates token.
func waitKeyGone(t *testing.T, srv *Server, token string) {
	t.Helper()
	for range 2000 {
		if k, _ := srv.Keys().Authenticate(token); k == nil {
			return
		}
		sleepMs(10)
	}
	t.Fatal("the server still authenticates a revoked key")
}

// The buckets of keys revoked or gone from the keys topic are not kept
// for ever: each is dropped once it has refilled (then a new bucket is
// the same), so that a replica's memory does not grow with every key it
// ever served. Until then it is kept (TestReinstatedKeyKeepsItsBudget).
func TestKeyBucketsPruned(t *testing.T) {
	e, move := clockEnv(t)
	ctx := context.Background()
	spent, spentToken, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme", Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	deleted, deletedToken, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme", Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	refused, refusedToken, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme"}) // no rate: a refusal budget
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 4)
	ten := apiCalls(10)
	if status, _, b := e.post("/v1/events", "application/json", spentToken, ten); status != http.StatusAccepted {
		t.Fatalf("10 events at rate 10: %d %s", status, b)
	}
	if status, _, b := e.post("/v1/events", "application/json", deletedToken, apiCall("b", "acme-1")); status != http.StatusAccepted {
		t.Fatalf("1 event at rate 10: %d %s", status, b)
	}
	if status, _, b := e.post("/v1/events", "application/json", refusedToken, []byte(`{"event_id":"c"}`)); status != http.StatusBadRequest {
		t.Fatalf("a bad event: %d %s", status, b)
	}
	if _, err := e.admin.RevokeKey(ctx, spent.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RevokeKey(ctx, refused.ID); err != nil {
		t.Fatal(err)
	}
	e.tombstone(deleted.ID)
	for _, tok := range []string{spentToken, refusedToken, deletedToken} {
		waitKeyGone(t, e.srv, tok)
	}
	if status, _, b := e.post("/v1/events", "application/json", e.token, apiCall("d", "acme-1")); status != http.StatusAccepted {
		t.Fatalf("another key: %d %s", status, b)
	}
	if !e.hasBucket(spent.ID) {
		t.Fatal("the spent bucket of a revoked key was dropped at once: a key reinstated with its ID would have a full bucket")
	}
	move(2 * time.Second) // every bucket refilled
	if status, _, b := e.post("/v1/events", "application/json", e.token, apiCall("e", "acme-1")); status != http.StatusAccepted {
		t.Fatalf("another key, 2s later: %d %s", status, b)
	}
	for _, k := range []Key{spent, deleted, refused} {
		if e.hasBucket(k.ID) {
			t.Errorf("key %s, revoked or deleted, keeps its bucket once it has refilled", k.ID)
		}
	}
}

// A key revoked, or deleted from the keys topic, and then reinstated
// (its record written back, with the same ID and token) goes on with its
// bucket as it was: its budget is not reset by the round trip, so it
// cannot send more than its rate by being revoked and reinstated.
func TestReinstatedKeyKeepsItsBudget(t *testing.T) {
	for _, how := range []string{"revoked", "deleted"} {
		t.Run(how, func(t *testing.T) {
			e, move := clockEnv(t)
			ctx := context.Background()
			key, token, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme", Rate: 1}) // the bucket holds 10 (MaxEvents)
			if err != nil {
				t.Fatal(err)
			}
			waitKeys(t, e.srv, 2)
			ten := apiCalls(10)
			if status, _, b := e.post("/v1/events", "application/json", token, ten); status != http.StatusAccepted {
				t.Fatalf("10 events: %d %s", status, b)
			}
			if how == "revoked" {
				if _, err := e.admin.RevokeKey(ctx, key.ID); err != nil {
					t.Fatal(err)
				}
			} else {
				e.tombstone(key.ID)
			}
			waitKeyGone(t, e.srv, token)
			move(time.Second)
			// Other keys' requests go on meanwhile (and sweep the buckets).
			if status, _, b := e.post("/v1/events", "application/json", e.token, apiCall("b", "acme-1")); status != http.StatusAccepted {
				t.Fatalf("another key: %d %s", status, b)
			}
			if err := e.admin.write(ctx, keyRecordKey(key.ID), record{Key: &key}); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				if k, _ := e.srv.Keys().Authenticate(token); k != nil {
					break
				}
				if i == 2000 {
					t.Fatal("the reinstated key is not authenticated")
				}
				sleepMs(10)
			}
			move(time.Second)
			// 2 s after its bucket was spent, at 1 event a second: 2 tokens.
			status, _, b := e.post("/v1/events", "application/json", token, ten)
			if status != http.StatusTooManyRequests {
				t.Fatalf("10 events 2s after 10 at rate 1, the key %s and reinstated: %d %s, want 429", how, status, b)
			}
			move(10 * time.Second)
			if status, _, b := e.post("/v1/events", "application/json", token, ten); status != http.StatusAccepted {
				t.Fatalf("10 events once the bucket refilled: %d %s", status, b)
			}
		})
	}
}

// At most maxBuckets buckets are kept. Past it, the spent buckets that
// refill the soonest are dropped, and a bucket made before the last of
// them would have refilled starts as spent as it: neither a key whose
// bucket was dropped nor a new one can send more than its rate by it.
func TestBucketsBounded(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	l := newLimiters(10, 1000)
	l.maxBuckets = 4
	keys := make([]*Key, 12)
	for i := range keys {
		keys[i] = &Key{ID: fmt.Sprintf("k%02d", i), Rate: 1} // buckets of 10, refilled in 10s
		// The first 4 fill the limiter; a 5th bucket evicts one of them
		// spent, and starts as spent.
		if d := l.take(keys[i], 10, now); (d == 0) != (i < 4) {
			t.Fatalf("key %d: a full request on a new bucket waits %s", i, d)
		}
		if n := len(l.byKey); n > 4 {
			t.Fatalf("%d buckets kept, want at most 4", n)
		}
	}
	// One second on: every key has one token, kept or not.
	later := now.Add(time.Second)
	for i, k := range keys {
		if d := l.take(k, 2, later); d == 0 {
			t.Errorf("key %d: 2 events passed 1s after its bucket of rate 1 was spent", i)
		}
	}
	if d := l.take(&Key{ID: "new", Rate: 1}, 2, later); d == 0 {
		t.Error("a new key passed 2 events while evicted buckets would still be spent")
	}
	// Once the buckets have refilled, they are as new: a key a minute
	// passes a full request (the last one's bucket has refilled, and
	// the floor is behind).
	for i, k := range keys {
		if d := l.take(k, 10, now.Add(time.Duration(i+1)*time.Minute)); d != 0 {
			t.Errorf("key %d: a full request once refilled waits %s", i, d)
		}
		if n := len(l.byKey); n != 1 {
			t.Errorf("%d buckets kept, want 1: the others were full", n)
		}
	}
}

// Requests reach the bucket out of the order of their times: each takes
// from it at the time it was received, after its body was read, which a
// slow client stretches up to the read timeout. A request received
// before the bucket was last spent must not give the key that time's
// refill a second time: 100 events at rate 1 (a bucket of 100), spent at
// 12:00:30, then a refused request received at 12:00:00 (a slow upload),
// leave nothing at 12:00:30 and less than 30 tokens at 12:00:58, not the
// 57 that 12:00:00 to 12:00:58 would refill.
func TestBucketTimesOutOfOrder(t *testing.T) {
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	spent := start.Add(30 * time.Second)
	for _, how := range []string{"take", "charge"} {
		t.Run(how, func(t *testing.T) {
			l := newLimiters(100, 1000)
			k := &Key{ID: "k", Rate: 1}
			if d := l.take(k, 100, spent); d != 0 {
				t.Fatalf("a full request on a new bucket waits %s", d)
			}
			if how == "take" {
				if d := l.take(k, 5, start); d == 0 {
					t.Fatal("5 events passed on a bucket spent")
				}
			} else {
				l.charge(k, 1, start)
			}
			if d := l.take(k, 1, spent); d == 0 {
				t.Fatalf("an event passed at the time the bucket was spent, after a request received 30 s before (%s)", how)
			}
			if d := l.take(k, 30, spent.Add(28*time.Second)); d == 0 {
				t.Fatalf("30 events passed 28 s after the bucket of rate 1 was spent (%s)", how)
			}
		})
	}
}

// TestTinyRateStillBounds: a key of a tiny rate (a key throttled to
// almost nothing: one event a century) is bounded like any other. The
// wait its bucket needs to refill is longer than time.Duration holds;
// computed without a bound, it wrapped negative, and admit, take and
// charge then let every request through.
func TestTinyRateStillBounds(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, r := range []float64{1e-9, 1e-10, 1e-12, 1e-300} {
		l := newLimiters(1000, 1000)
		k := &Key{ID: "k", Rate: r}
		if d := l.take(k, 1000, now); d != 0 {
			t.Fatalf("rate %g: a full request on a new bucket waits %s", r, d)
		}
		if d := l.admit(k, now); d <= 0 {
			t.Errorf("rate %g: admit lets a request in on a spent bucket (wait %s)", r, d)
		}
		if d := l.take(k, 1, now); d <= 0 {
			t.Errorf("rate %g: an event passed on a spent bucket (wait %s)", r, d)
		}
		if d := l.charge(k, 5, now); d <= 0 {
			t.Errorf("rate %g: charge says the bucket holds a token (wait %s)", r, d)
		}
	}
	// The refusal budget of a key without a rate, alike.
	l := newLimiters(1000, 1e-12)
	k := &Key{ID: "norate"}
	if d := l.charge(k, 1000, now); d <= 0 {
		t.Errorf("refusal budget 1e-12: charge of a full request leaves a token (wait %s)", d)
	}
	if d := l.admit(k, now); d <= 0 {
		t.Errorf("refusal budget 1e-12: admit lets a request in on a spent budget (wait %s)", d)
	}
}
